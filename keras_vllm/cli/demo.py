"""The handoff end to end on a tiny model built offline (`keras-vllm demo`).

Training side: build a tiny KerasHub model, save it as a local preset (the
stand-in for a Kaggle/Hugging Face preset), load it back with
`from_preset`, fine-tune it, export it. Serving side: verify the artifact,
start a vLLM engine on it, generate, and check that every served token
equals what `CausalLM.generate()` produces.
"""

import os
import tempfile
import time

EXIT_OK, EXIT_MISMATCH = 0, 1
# Tokens served per prompt and compared with `generate()`'s.
NEW_TOKENS = 24


def _step(message):
    print(f"==> {message}", flush=True)


def _float32_matmuls_in_full():
    """Asks JAX for full-precision float32 matmuls on an accelerator.

    A TPU's default float32 matmul takes bfloat16 passes, and Keras and the
    engine group their sums differently, so their greedy tokens drift apart
    within a few tokens (on a TPU v5e: 5 of the 6 prompts equal). The demo
    compares token for token, so unless `JAX_DEFAULT_MATMUL_PRECISION` is
    set it asks for "highest", in this process and (by the environment) in
    an engine process of its own. CPU matmuls are full precision anyway.

    Returns:
        The backend's name when the precision was set, else None.
    """
    import jax

    backend = jax.default_backend()
    if backend == "cpu" or os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"):
        return None
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    jax.config.update("jax_default_matmul_precision", "highest")
    return backend


def run(family="llama3", workdir=None, steps=100):
    """Runs the demo; returns a process exit code (0 when tokens match)."""
    from keras_vllm import _env  # noqa: F401

    import keras_hub

    import keras_vllm
    from keras_vllm import format as fmt
    from keras_vllm.hub import reference
    from keras_vllm import testing
    from keras_vllm.load.keras_loader import check_golden
    from keras_vllm.serve.engine import greedy

    workdir = workdir or tempfile.mkdtemp(prefix="keras_vllm_demo_")
    os.makedirs(workdir, exist_ok=True)
    preset = os.path.join(workdir, "preset")
    out = os.path.join(workdir, "artifact")
    started = time.time()

    backend = _float32_matmuls_in_full()
    if backend is not None:
        print(f"    on {backend}: float32 matmuls at full precision on both "
              "sides (JAX_DEFAULT_MATMUL_PRECISION=highest), so the token "
              "comparison is exact")
    _step(f"training side: tiny {family} model, built offline")
    if not os.path.isdir(preset):
        testing.save_tiny_preset(testing.build_tiny_causal_lm(family), preset)
    causal_lm = keras_hub.models.CausalLM.from_preset(preset)
    causal_lm.compile(sampler="greedy")
    losses = testing.fine_tune(causal_lm, steps=steps)
    print(f"    fine-tuned {steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    path = causal_lm.export_vllm(
        out,
        overwrite=True,
        max_sequence_length=256,
        golden_prompts=testing.prompts(),
    )
    opened = fmt.open_artifact(path)
    mode = opened.manifest["weights"]["mode"]
    # Fine-tuning moved every variable: stored full, pinning no preset.
    relation = "from" if mode == "full" else "against"
    print(f"    exported {path} ({mode} weights, {relation} preset {preset})")

    _step("serving side: verify the artifact in Keras")
    loaded = keras_vllm.load_causal_lm(path)
    failures = check_golden(loaded, opened)
    print(f"    checksums ok; golden outputs {'ok' if not failures else failures}")

    _step("serving side: start the vLLM engine on the artifact")
    t = time.time()
    prompts = testing.prompts()
    with keras_vllm.KerasVllmEngine.from_export(path) as engine:
        print(f"    engine ready in {time.time() - t:.0f} s")
        served = greedy.greedy_continuations(engine, prompts, NEW_TOKENS)
    matches = 0
    for text, (completion, got) in zip(prompts, served):
        ids = reference.prompt_token_ids(causal_lm, text)
        want = reference.greedy_continuation(causal_lm, ids, NEW_TOKENS, [])
        matches += got == want
        mark = "==" if got == want else "!="
        print(f"    {text!r:>20} -> {completion!r:.60} [{mark} generate()]")
    _step(
        f"{matches}/{len(prompts)} served continuations equal "
        f"CausalLM.generate() token for token ({time.time() - started:.0f} s)"
    )
    return EXIT_OK if matches == len(prompts) and not failures else EXIT_MISMATCH
