"""bfloat16 serving on a TPU against Keras in bfloat16 on the same chip.

The tiny fine-tuned float32 model (`helpers.trained_models`) is exported
once; Keras rebuilds it in bfloat16 and an engine in this process serves it
in bfloat16, both at the chip's default matmul precision (not the tier's
`highest_precision`: what a user serving bfloat16 gets). Two bfloat16
programs that group their sums differently may pick either of two tokens
whose logits bfloat16 cannot tell apart, so greedy tokens are not asserted
equal: every prompt that diverges must diverge at a near-tie, Keras' top-1
logit at most `bf16_checks.NEAR_TIE_ULPS` bfloat16 ulps above the engine's
token (`helpers/bf16_checks.py`), and teacher-forced prompt logprobs must
stay within `LOGPROB_ATOL` of Keras' bfloat16 forward pass.

With `KERAS_VLLM_TPU_REPORT=PATH` each family appends one JSON line
(`tpu_tier.report`, as test_tpu_families.py does): prompts equal of 9, each
divergence with Keras' margin, the bfloat16 ulp there and the engine's
logprob gap, the worst logprob gap, seconds.

Cost: nothing on a CPU host (skipped). On a TPU v5e, ~1-2 minutes a family
(fine-tune unless carried, export, Keras' bfloat16 load and `generate()`
compile, engine start and compiles). The same steps ran on a 2-core CPU
host in 45-60 s a family (fine-tune included), 25-30 s with the fine-tunes
and XLA programs cached.
"""

import gc

import pytest

pytestmark = [pytest.mark.tpu, pytest.mark.serving]

pytest.importorskip("tpu_inference")

from helpers import bf16_checks  # noqa: E402
from helpers import family_serving  # noqa: E402
from helpers import tpu_tier  # noqa: E402
from helpers.trained_models import trained  # noqa: E402

FAMILIES = ("llama3", "gemma3")

# Worst teacher-forced logprob difference allowed between the engine and
# Keras, both in bfloat16, over the ~90-130 positions of the last three
# serving prompts. bfloat16 keeps 8 significant bits and these models'
# logits reach 14-18 (an ulp of 0.0625-0.125 nats), so each side lies a few
# tenths of a nat from exact at its tail positions. Measured on a CPU host:
# Keras bf16 against Keras float32 0.39 (llama3) and 0.15 (gemma3); engine
# against Keras, both bf16, 0.32 (llama3, at a token of logprob -20; median
# 0.01) and 0.11 (gemma3). Two bf16 computations can be up to the sum of
# their distances from exact apart: 1.0 holds that with room for the chip
# rounding otherwise. A wrong scale, mask or cache read moves many positions
# by whole nats; subtler errors are the float32 tier's (bound 1e-3).
LOGPROB_ATOL = 1.0


def _check(family, tmp_path, row):
    """Measures `family` in bfloat16; fills `row` with what it found."""
    causal_lm, engine = bf16_checks.start(
        trained(family), tmp_path / "artifact",
        **family_serving.ENGINE_KWARGS.get(family, {}),
    )
    try:
        row.update(bf16_checks.measure(
            engine, causal_lm, family_serving.greedy_reference(family)
        ))
    finally:
        engine.shutdown()
        del engine
        # An engine in this process holds its KV cache (most of the chip's
        # memory) until collected; the next engine's start counts it as used.
        gc.collect()


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_serving_diverges_only_at_near_ties(family, tmp_path):
    import jax

    assert jax.default_backend() == "tpu", jax.devices()
    # The default precision is what this measures; the tier's
    # `highest_precision` fixture restores it after each test.
    precision = jax.config.jax_default_matmul_precision
    assert precision in (None, "default"), precision
    row = {"family": family, "dtype": "bfloat16", "precision": "default"}
    with tpu_tier.reported(row):
        _check(family, tmp_path, row)
    unexplained = [d for d in row["divergences"] if not d["explained"]]
    assert not unexplained, row
    assert row["worst_logprob_gap"] <= LOGPROB_ATOL, row
