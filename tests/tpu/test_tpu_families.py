"""Every served family on a TPU equals Keras on the same chip.

Float32 tiny models, fine-tuned on the chip (`helpers.trained_models`),
exported and served by an engine in this process; both sides at "highest"
matmul precision (`conftest.highest_precision`). Per family: greedy tokens
against the family's reference (`generate()`, or the forward pass where
KerasHub's cached decoding is not it), prompt logprobs against Keras' full
forward pass, and the golden outputs export recorded on the chip.

With `KERAS_VLLM_TPU_REPORT=PATH` each family appends one JSON line (tokens
equal, worst logprob gap, seconds): the table of docs/TPU.md.

Cost: nothing on a CPU host (skipped). On a TPU v5e, ~1-2 minutes a family
(fine-tune, export, engine start and compiles).
"""

import gc
import json
import os
import time
import traceback

import pytest

pytestmark = [pytest.mark.tpu, pytest.mark.serving]

pytest.importorskip("tpu_inference")

from helpers import family_serving  # noqa: E402
from helpers import serving_checks  # noqa: E402

# Worst teacher-forced logprob difference allowed at "highest" precision:
# float32 accumulated in another order (the CPU tier's bound is 1e-4; the
# chip's float32 passes round differently). A wrong scale, mask or cache
# read moves logprobs by far more.
LOGPROB_ATOL = 1e-3


def _report(row):
    path = os.environ.get("KERAS_VLLM_TPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def _check(family, tmp_path, row):
    """Serves `family`'s model; fills `row` with what each check found."""
    model, engine = family_serving.start_family_engine(
        family, tmp_path / "artifact"
    )
    try:
        try:
            serving_checks.check_greedy_matches_generate(
                engine, model, greedy=family_serving.greedy_reference(family)
            )
            row["greedy"] = "equal"
        except AssertionError as e:
            row["greedy"] = f"differs: {str(e)[:300]}"
        row["worst_logprob_gap"] = float(
            serving_checks.check_prompt_logprobs(
                engine, model, atol=float("inf")
            )
        )
        row["golden_mismatches"] = len(engine.check_golden())
    finally:
        serving_checks.shutdown(engine)
        del engine
        # An engine in this process holds its KV cache (most of the chip's
        # memory) until collected; the next engine's start counts it as used.
        gc.collect()


@pytest.mark.parametrize("family", family_serving.ALL_FAMILIES)
def test_family_equals_keras_on_the_chip(
    family, tmp_path, highest_precision
):
    import jax

    assert jax.default_backend() == "tpu", jax.devices()
    start = time.perf_counter()
    row = {"family": family, "precision": highest_precision}
    try:
        _check(family, tmp_path, row)
    except BaseException:
        row["error"] = traceback.format_exc()[-1500:]
        raise
    finally:
        row["seconds"] = round(time.perf_counter() - start, 1)
        _report(row)
    assert row["greedy"] == "equal", row
    assert isinstance(row["worst_logprob_gap"], float), row
    assert row["worst_logprob_gap"] <= LOGPROB_ATOL, row
    assert row["golden_mismatches"] == 0, row
