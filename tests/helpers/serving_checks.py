"""Checks shared by the per-family serving test modules.

Each module starts one engine (vLLM's default multiprocess mode, default
scheduling, sized by `engine_shapes`) on a fine-tuned tiny model's artifact
and compares it with `CausalLM.generate()` and with the full forward pass.
"""

import contextlib
import time
import weakref

import pytest

from helpers import engine_shapes
from keras_vllm.hub import reference
from keras_vllm import testing

NEW_TOKENS = 32


def serving_prompts():
    """≥ 8 prompts of different lengths, some longer than a 16-token window."""
    corpus = testing.corpus()
    prompts = list(testing.prompts())
    prompts.append(corpus[0] + " " + corpus[1])
    prompts.append(" ".join(corpus[2:5]))
    prompts.append("a")
    return prompts


# Keras' expected continuations, per process: the single-device and the
# tensor-parallel modules check the same session-wide models on the same
# prompts, and each batch of expectations costs a `generate()` compile.
_EXPECTED = weakref.WeakKeyDictionary()

def greedy_by_cached_steps(causal_lm, token_ids, max_new_tokens, stop_token_ids):
    """Greedy new ids from Keras' own cached decoding, step by step.

    The prompt is prefilled at its own length (`call_with_cache` over exactly
    the prompt), then one token per call, as vLLM runs a sequence. The
    reference for layers whose math depends on the length a call covers:
    Phi-3's "su" RoPE picks its long or short factors by `start_index +
    length`, and `generate()` prefills the prompt padded to `max_length`, so
    a prompt at or below the pretraining length whose padded length exceeds
    it gets long-factor keys there (and rows of a batch depend on each
    other). Step by step, each token's factors follow its own sequence
    length, which is what the paged layer serves.

    Each call is jitted with the cache index traced: one compile per prompt
    length and one for every decode step (eagerly, each step dispatched
    every op on its own: 45 s for the serving prompts on a CPU host, 131 s
    on a TPU v5e, against 10 s here).
    """
    from keras import ops

    ids = [int(i) for i in token_ids]
    length = len(ids) + max_new_tokens
    # `_build_cache` sizes the cache from its input; the seeded values past
    # the prompt are never read (causal masks) and are overwritten as
    # tokens are fed.
    _, cache = causal_lm._build_cache(ops.zeros((1, length), dtype="int32"))
    step = _cached_step(causal_lm)
    logits, cache = step(ops.convert_to_tensor([ids], dtype="int32"), cache, 0)
    new = []
    index = len(ids)
    while len(new) < max_new_tokens:
        token = int(ops.convert_to_numpy(ops.argmax(logits[0, -1])))
        new.append(token)
        if token in (stop_token_ids or ()) or index >= length:
            break
        logits, cache = step(
            ops.convert_to_tensor([[token]], dtype="int32"), cache, index
        )
        index += 1
    return new


# One jitted `call_with_cache` per model, held weakly (the step reaches the
# model through a weak reference, so the entry never keeps its key alive).
_CACHED_STEPS = weakref.WeakKeyDictionary()


def _cached_step(causal_lm):
    """`causal_lm.call_with_cache` jitted: `(ids, cache, index) -> (logits,
    cache)`, the weights read as constants of the program."""
    import jax

    if causal_lm not in _CACHED_STEPS:
        model = weakref.ref(causal_lm)

        def step(token_ids, cache, index):
            logits, _, cache = model().call_with_cache(token_ids, cache, index)
            return logits, cache

        _CACHED_STEPS[causal_lm] = jax.jit(step)
    return _CACHED_STEPS[causal_lm]


# The greedy reference functions by the name `reference.greedy_batch` takes
# (None: computed here, one prompt at a time).
_NAMES = {
    reference.greedy_continuation: "generate",
    reference.greedy_by_forward_pass: "forward_pass",
    greedy_by_cached_steps: None,
}


def expected_batch(greedy, causal_lm, prompt_ids, new_tokens, stops=()):
    """`greedy`'s tokens for each prompt of `prompt_ids`, computed once.

    The prompts not seen before are decoded together by
    `reference.greedy_batch` (one compile for all, where one call per prompt
    compiles once per prompt length).
    """
    # Keyed by the model object itself, held weakly: an `id()` is reused
    # once a module's model is freed, and another family's model then read
    # the first one's expectations (seen in CI: phi3 against an earlier
    # module's tokens).
    memo = _EXPECTED.setdefault(causal_lm, {})
    name = _NAMES[greedy]

    def key(ids):
        return (greedy.__name__, tuple(ids), new_tokens, tuple(stops))

    missing = list(dict.fromkeys(tuple(ids) for ids in prompt_ids))
    missing = [ids for ids in missing if key(ids) not in memo]
    if name is None:
        rows = [greedy(causal_lm, ids, new_tokens, list(stops)) for ids in missing]
    else:
        rows = reference.greedy_batch(
            causal_lm, [list(ids) for ids in missing], new_tokens,
            list(stops), name=name,
        )
    for ids, row in zip(missing, rows):
        memo[key(ids)] = list(row)
    return [memo[key(ids)] for ids in prompt_ids]


def start_engine(causal_lm, directory, phases=None, **engine_kwargs):
    """Exports `causal_lm` and starts an engine sized to the serving checks
    (`engine_shapes.ENGINE_KWARGS`, unless `engine_kwargs` say otherwise).
    With a dict as `phases`, the seconds of the export and of the engine's
    start go in it (the TPU tier's rows)."""
    import keras_vllm

    skip_without_chips(engine_kwargs)
    with timed_phase(phases, "export"):
        path = causal_lm.export_vllm(
            directory,
            max_sequence_length=256,
            golden_prompts=testing.prompts()[:2],
        )
    with timed_phase(phases, "engine_start"):
        return keras_vllm.KerasVllmEngine.from_export(
            path, **(engine_shapes.ENGINE_KWARGS | engine_kwargs)
        )


def skip_without_chips(engine_kwargs):
    """Skips a test whose engine spans more accelerators than this host has.

    A CPU host makes as many JAX CPU devices as an engine asks for
    (`keras_vllm.cpu`); a TPU host has its chips (the lent v5e: one), where
    tpu-inference would refuse `tensor_parallel_size=2` at engine start.
    """
    from keras_vllm.cpu import detect

    wanted = engine_kwargs.get("tensor_parallel_size", 1) * engine_kwargs.get(
        "data_parallel_size", 1
    )
    if wanted <= 1 or detect.is_cpu_host():
        return
    import jax

    if wanted > jax.device_count():
        pytest.skip(f"needs {wanted} accelerators; this host has "
                    f"{jax.device_count()}")


@contextlib.contextmanager
def timed_phase(phases, name):
    """Adds the seconds the block takes to `phases[name]` (no-op for
    None)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if phases is not None:
            phases[name] = round(
                phases.get(name, 0.0) + time.perf_counter() - start, 1
            )


def check_greedy_matches_generate(
    engine, causal_lm, greedy=reference.greedy_continuation, phases=None
):
    """`greedy` computes the expected tokens (default: `generate()`'s).
    With a dict as `phases`, the seconds of Keras' reference and of the
    engine's requests go in it.

    Returns:
        The engine's outputs (vLLM `RequestOutput`s).
    """
    from vllm import SamplingParams

    prompts = serving_prompts()
    with timed_phase(phases, "greedy_keras"):
        expected = expected_batch(
            greedy, causal_lm, _ids(causal_lm, prompts), NEW_TOKENS
        )
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    with timed_phase(phases, "greedy_engine"):
        outputs = engine.generate(prompts, params)
    mismatches = []
    for text, out, want in zip(prompts, outputs, expected):
        assert out.prompt_token_ids == reference.prompt_token_ids(
            causal_lm, text
        )
        got = list(out.outputs[0].token_ids)
        if got != want:
            mismatches.append((text, want, got))
    assert not mismatches, mismatches
    assert len({tuple(w) for w in expected}) > 2, "outputs ignore the prompt"
    return outputs


def check_prompt_logprobs(engine, causal_lm, atol=1e-4, median_atol=None):
    """Served teacher-forced logprobs against Keras' full forward pass.

    Args:
        atol: the bound every position meets.
        median_atol: a tighter bound for the median position, for layers
            whose computation is not continuous in their inputs (Keras'
            int8 activations are rounded per token to 1/127 of their
            abs-max): a 1-ulp difference in XLA's summation order can move
            one value across a rounding boundary, which shifts that position
            and, through attention, some later ones by far more than the
            rest (seen: 0.10 at one of 160 positions on the tiny Llama, 13 of
            91 between 1e-3 and 0.05 on GPT-2). Wrong scales or a skipped
            layer move every position.

    Returns:
        The largest difference.
    """
    from vllm import SamplingParams

    prompts = serving_prompts()[-3:]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outputs = engine.generate(prompts, params)
    differences = []
    # One compiled call for the prompts (quantized models: one eager pass
    # each, see `reference.teacher_forced_logprobs_batch`).
    references = reference.teacher_forced_logprobs_batch(
        causal_lm, [out.prompt_token_ids for out in outputs]
    )
    for out, keras_logprobs in zip(outputs, references):
        ids = out.prompt_token_ids
        for i in range(1, len(ids)):
            served = out.prompt_logprobs[i][ids[i]].logprob
            differences.append(abs(served - keras_logprobs[i - 1, ids[i]]))
    differences = sorted(differences)
    assert differences[-1] <= atol, differences[-20:]
    if median_atol is not None:
        median = differences[len(differences) // 2]
        assert median <= median_atol, (median, differences[-20:])
    return differences[-1]


def check_default_sampling_is_the_models(
    engine, causal_lm, greedy=reference.greedy_continuation
):
    """The exported model is greedy, so requests without sampling params are
    deterministic and equal greedy decoding, for as many new tokens as the
    model's own `generate()` makes by default (up to its preprocessor's
    `sequence_length` in all)."""
    from keras_vllm.serve.engine import sampling_defaults

    prompts = testing.prompts()
    first = [list(o.outputs[0].token_ids) for o in engine.generate(prompts)]
    second = [list(o.outputs[0].token_ids) for o in engine.generate(prompts)]
    assert first == second
    stops = reference.default_stop_token_ids(causal_lm.preprocessor.tokenizer)
    length = sampling_defaults.generate_length(engine.manifest)
    assert length is not None
    prompt_ids = _ids(causal_lm, prompts)
    counts = [max(length - len(ids), 1) for ids in prompt_ids]
    # All prompts in one batch for the longest count, each row cut to its
    # own (greedy decoding's first n tokens do not depend on how many
    # follow): one reference compile instead of one per prompt length.
    rows = expected_batch(greedy, causal_lm, prompt_ids, max(counts), stops)
    wants = [row[:n] for row, n in zip(rows, counts)]
    assert first == wants


def _ids(causal_lm, prompts):
    return [reference.prompt_token_ids(causal_lm, text) for text in prompts]


def shutdown(engine):
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(["a"])
