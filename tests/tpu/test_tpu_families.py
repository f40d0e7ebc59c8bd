"""Every served family on a TPU equals Keras on the same chip.

Float32 tiny models, fine-tuned (`helpers.trained_models`: on the chip,
or carried), exported and served by an engine in this process; both sides at "highest"
matmul precision (`conftest.highest_precision`). Per family: greedy tokens
against the family's reference (`generate()`, or the forward pass where
KerasHub's cached decoding is not it), prompt logprobs against Keras' full
forward pass, and the golden outputs export recorded on the chip.

The cases (`tpu_tier.CASES`) are every family in its tested variant and
Qwen 3.5 again with its presets' 128-wide linear-attention heads (the GDN
Pallas kernel's shapes; the tiny 16-wide heads run the portable kernel).

With `KERAS_VLLM_TPU_REPORT=PATH` each case appends one JSON line (tokens
equal, worst logprob gap, seconds, the seconds of each step): the table of
docs/TPU.md. With `KERAS_VLLM_TPU_FINE_TUNES=DIR` the fine-tunes come from
DIR (made on any host: `tpu_tier.prepare_fine_tunes`) instead of the chip.

Cost: nothing on a CPU host (skipped). On a TPU v5e, ~1-2 minutes a family
(fine-tune unless carried, export, engine start and compiles).
"""

import gc

import pytest

pytestmark = [pytest.mark.tpu, pytest.mark.serving]

pytest.importorskip("tpu_inference")

from helpers import family_serving  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers import tpu_tier  # noqa: E402

# Worst teacher-forced logprob difference allowed at "highest" precision:
# float32 accumulated in another order (the CPU tier's bound is 1e-4; the
# chip's float32 passes round differently). A wrong scale, mask or cache
# read moves logprobs by far more.
LOGPROB_ATOL = 1e-3

# Every engine step of a case in one token bucket. On the chip, turning an
# engine step's program into MLIR takes ~8 s per step shape for each static
# configuration of tpu-inference's RPA Pallas kernel the model calls
# (docs/TPU.md), more than its XLA compile, and each token bucket is a
# shape: the 9-prompt prefill (256), the decode steps (16) and the golden
# requests (32) made three. With a 16-token budget every step is 16
# tokens: prompts are prefilled in chunks beside the decoding ones (what
# a loaded server does), and each case lowers one program per
# configuration.
STEP_TOKENS = {"max_num_batched_tokens": 16}


def _check(family, overrides, tmp_path, row):
    """Serves `family`'s model; fills `row` with what each check found and
    the seconds of each step (`row["phases"]`)."""
    phases = row["phases"]
    model, engine = family_serving.start_family_engine(
        family, tmp_path / "artifact", overrides=overrides, phases=phases,
        **STEP_TOKENS,
    )
    _record_kernels(model, row)
    try:
        try:
            serving_checks.check_greedy_matches_generate(
                engine, model,
                greedy=family_serving.greedy_reference(family),
                phases=phases,
            )
            row["greedy"] = "equal"
        except AssertionError as e:
            row["greedy"] = f"differs: {str(e)[:300]}"
        with serving_checks.timed_phase(phases, "logprobs"):
            row["worst_logprob_gap"] = float(
                serving_checks.check_prompt_logprobs(
                    engine, model, atol=float("inf")
                )
            )
        with serving_checks.timed_phase(phases, "goldens"):
            row["golden_mismatches"] = len(engine.check_golden())
    finally:
        serving_checks.shutdown(engine)
        del engine
        # An engine in this process holds its KV cache (most of the chip's
        # memory) until collected; the next engine's start counts it as used.
        gc.collect()


def _record_kernels(model, row):
    """Which gated delta rule kernel the model's linear-attention layers
    run on this device (`gated_delta_rule.kernel_for`), if it has any."""
    from keras_vllm.layers.common import gated_delta_rule

    kernels = set()
    for layer in model.backbone._flatten_layers():
        if hasattr(layer, "head_k_dim") and hasattr(layer, "head_v_dim"):
            kernel = gated_delta_rule.kernel_for(
                layer.head_k_dim, layer.head_v_dim
            )
            kernels.add("portable JAX" if kernel else "Pallas GDN v3")
    if kernels:
        row["gdn_kernel"] = sorted(kernels)


@pytest.mark.parametrize("case", tpu_tier.CASES, ids=tpu_tier.case_id)
def test_family_equals_keras_on_the_chip(case, tmp_path, highest_precision):
    import jax

    assert jax.default_backend() == "tpu", jax.devices()
    family, overrides = case
    row = {
        "family": tpu_tier.case_id(case),
        "precision": highest_precision,
        "phases": {},
    }
    with tpu_tier.reported(row):
        _check(family, overrides, tmp_path, row)
    assert row["greedy"] == "equal", row
    assert isinstance(row["worst_logprob_gap"], float), row
    assert row["worst_logprob_gap"] <= LOGPROB_ATOL, row
    assert row["golden_mismatches"] == 0, row
