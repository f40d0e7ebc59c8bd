"""Serving delta artifacts over Hugging Face-format checkpoints.

For each family issue #15 names, and SmolLM3, Gemma 4 and GPT-OSS (issue
#35: SmolLM3's NoPE layers and keras-vllm's fixes of keras-hub's SmolLM3
classes; keras-vllm's fixes of keras-hub's Gemma 4 and GPT-OSS converters;
all through keras-hub's own converters) (a tiny checkpoint written locally with `transformers`;
keras-hub converts it on load): the checkpoint's CausalLM
with some weights changed, the default `export_vllm(out)` (a delta pinning
the checkpoint's files), one engine start in vLLM's default multiprocess
mode, greedy output token-exact against `generate()` and teacher-forced
logprobs against Keras' forward pass. Serving loads the base through
keras-hub's own converter, then applies the delta. Export-side checks (pins,
refusals, Keras load) are in test_hf_presets.py.
"""

import pytest

from helpers import hf_checkpoints
from keras_vllm import format as fmt
from keras_vllm.hub import reference


# The families issue #15 asks for, and SmolLM3, Gemma 4 and GPT-OSS (#35);
# Qwen2 written sharded (`hf_checkpoints.SHARDED`), so the engine also reads
# the base through an index. Gemma 4 is written by transformers 5.19 (its
# global layers' shape in `per_layer_config`, no processor_config.json),
# GPT-OSS as published (MXFP4 experts, YaRN in `rope_scaling`): keras-vllm's
# `layers/gemma4_hf_fixes.py` and `gpt_oss_hf_fixes.py` convert both.
# Qwen 3.5 and Qwen 3.5 MoE (#38) are written as published (the language
# model of an image-text checkpoint; no vision tower); their reference is
# greedy decoding by the forward pass, as their manifest declares.
FAMILIES = (
    "llama", "qwen2", "gemma2", "mistral", "gpt2", "smollm3", "gemma4",
    "gpt_oss", "qwen3_5", "qwen3_5_moe",
)
# Each engine costs 30-60 s of CI on 2 cores. What is per family here is
# keras-hub's conversion (checked against transformers for every family by
# tests/export/test_hf_transformers_parity.py, and the delta export by
# tests/export/test_hf_presets.py, no engine) and what the engine reads of a
# delta over a checkpoint; the CI tier serves a delta over a single-file
# checkpoint (Llama), a sharded one (Qwen2), MXFP4 experts converted at load
# (GPT-OSS) and a hybrid image-text checkpoint's language model (Qwen 3.5);
# the other families are in `-m matrix` (docs/TESTING.md).
IN_CI = ("llama", "qwen2", "gpt_oss", "qwen3_5")
CASES = [
    pytest.param(family, marks=() if family in IN_CI else pytest.mark.matrix)
    for family in FAMILIES
]
# Gemma 4's tiny random checkpoint repeats one token per prompt unless its
# other kernels move too.
EVERY_KERNEL = {"gemma4": 0.3}
NEW_TOKENS = 16


@pytest.mark.parametrize("family", CASES)
def test_engine_serves_delta_on_hf_checkpoint(
    family, hf_checkpoint_root, tmp_path
):
    pytest.importorskip("tpu_inference")
    from vllm import SamplingParams

    import keras_vllm
    from helpers import engine_shapes
    from helpers import serving_checks

    directory = hf_checkpoints.cached_checkpoint(hf_checkpoint_root, family)
    causal_lm = hf_checkpoints.changed_model(
        directory, every_kernel=EVERY_KERNEL.get(family)
    )
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=256, golden_prompts=[]
    )
    manifest = fmt.read_manifest(out)
    assert manifest["weights"]["mode"] == "delta"
    assert manifest["preset"]["files"], "the delta pins no checkpoint file"
    prompts = serving_checks.serving_prompts()[:4]
    want = reference.greedy_batch(
        causal_lm,
        [reference.prompt_token_ids(causal_lm, text) for text in prompts],
        NEW_TOKENS,
        [],
        name=manifest["golden_reference"],
    )
    assert len({tuple(w) for w in want}) > 1, "outputs ignore the prompt"
    engine = keras_vllm.KerasVllmEngine.from_export(
        out, **engine_shapes.ENGINE_KWARGS
    )
    try:
        outputs = engine.generate(
            list(prompts),
            SamplingParams(
                temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
            ),
        )
        assert [list(o.outputs[0].token_ids) for o in outputs] == want
        serving_checks.check_prompt_logprobs(engine, causal_lm)
    finally:
        serving_checks.shutdown(engine)
