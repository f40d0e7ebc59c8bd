"""`keras_vllm.load_causal_lm` on a TPU host gives a model on the chip.

A training team reloading an export on a TPU host must get a model whose
`generate()` runs on the chip: orbax restores an artifact's weights onto the
host's CPU device, and before `keras_loader._onto_default_device` the
reloaded model's `generate()` ran there (46 tok/s on the chip's host where
the model it came from ran 1,331). Checked here: every variable of the
reloaded model lives on the TPU, its `generate()` gives the tokens of the
model it was exported from, and runs at that model's speed (both timed
after their compile, on the same prompts). The model is a random Llama 3
wide enough (64M float32 parameters) that the host's CPU decodes it many
times slower than the chip; a tiny model decodes as fast on either, so
the bound would prove nothing there. The bound is loose: a timing, not a
benchmark.

With `KERAS_VLLM_TPU_REPORT=PATH` it appends one JSON line (devices, tokens
equal, both tok/s).

Cost: nothing on a CPU host (skipped). On a TPU v5e ~20-40 s (build,
export and reload of ~280 MB, two `generate()` compiles).
"""

import time

import pytest

pytestmark = [pytest.mark.tpu]

from helpers import tpu_tier  # noqa: E402

# The reloaded model's decode rate over the original's, at least: the same
# program on the same chip runs at the same rate give or take the timer's
# noise; on the host's CPU it ran 29x slower.
MIN_SPEED_RATIO = 0.5
# A Llama 3 of the tiny fixture's kind, widened: 4 layers of width 1024.
WIDE = {"hidden_dim": 1024, "intermediate_dim": 4096, "num_layers": 4}
PROMPTS = ["the quick brown", "a b c d", "one two three four five", "the"]
NEW_TOKENS = 32


def _tokens_per_second(causal_lm):
    """Greedy output and decode rate of Keras' compiled generate function
    (`reference.greedy_batch`: what `generate()` calls, without the
    string preprocessing) over the prompts, timed after its compile."""
    from keras_vllm.hub import reference

    ids = [reference.prompt_token_ids(causal_lm, p) for p in PROMPTS]
    reference.greedy_batch(causal_lm, ids, NEW_TOKENS, [])  # compiles
    start = time.perf_counter()
    outputs = reference.greedy_batch(causal_lm, ids, NEW_TOKENS, [])
    seconds = time.perf_counter() - start
    return outputs, round(len(PROMPTS) * NEW_TOKENS / seconds, 1)


def test_load_causal_lm_puts_the_model_on_the_chip(tmp_path, highest_precision):
    import jax

    import keras_vllm
    from keras_vllm import testing

    assert jax.default_backend() == "tpu", jax.devices()
    row = {"check": "load_causal_lm on the chip", "family": "llama3", **WIDE}
    with tpu_tier.reported(row):
        model = testing.build_tiny_causal_lm("llama3", **WIDE)
        path = model.export_vllm(tmp_path / "artifact", golden_prompts=[])
        loaded = keras_vllm.load_causal_lm(path, verbose=False)
        platforms = {
            d.platform for v in loaded.backbone.variables
            for d in v.value.devices()
        }
        row["variable_platforms"] = sorted(platforms)
        want, row["original_tok_s"] = _tokens_per_second(model)
        got, row["reloaded_tok_s"] = _tokens_per_second(loaded)
        row["tokens_equal"] = got == want
    assert platforms == {"tpu"}, row
    assert got == want, row
    assert row["reloaded_tok_s"] >= MIN_SPEED_RATIO * row["original_tok_s"], row
