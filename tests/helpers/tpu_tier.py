"""The TPU tier's cases, its report rows and its carried fine-tunes.

The tier (`tests/tpu/`) checks every served family on a chip against Keras
on the same chip. A device call is short (10 minutes) and device time
scarce, so the tiny models' fine-tunes can be made on a CPU host ahead of
time and carried: `PYTHONPATH=tests python -m helpers.tpu_tier DIR`
fine-tunes every case into DIR (`trained_models`' shared store: weights and losses per
configuration), and `KERAS_VLLM_TPU_FINE_TUNES=DIR` on the TPU host makes
`trained()` load them instead of training there (what it cannot find, it
trains and stores). Where the weights were trained does not matter to the
checks: each compares the engine with Keras running the same weights on
the chip.
"""

import contextlib
import json
import os
import sys
import time
import traceback

from helpers import family_serving

# Every family in its tested variant, and Qwen 3.5 again with the
# linear-attention heads of every preset (128 wide): the tiny fixture's
# 16-wide heads run the portable gated delta rule on a TPU, 128-wide ones
# tpu-inference's GDN Pallas kernel (`layers/common/gated_delta_rule.py`).
PRESET_LINEAR_HEADS = {"linear_key_head_dim": 128, "linear_value_head_dim": 128}
CASES = [(family, {}) for family in family_serving.ALL_FAMILIES] + [
    ("qwen3_5", PRESET_LINEAR_HEADS),
]


def case_id(case):
    """`family`, or `family-heads128` for the preset-headed Qwen 3.5."""
    family, overrides = case
    return family + ("-heads128" if overrides else "")


def report(row):
    """Appends `row` to the JSON lines file `KERAS_VLLM_TPU_REPORT` names
    (docs/TPU.md's tables come from it)."""
    path = os.environ.get("KERAS_VLLM_TPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


@contextlib.contextmanager
def reported(row):
    """Runs a case's checks, then reports `row` with the case's seconds
    (and the end of the traceback as `row["error"]` if they raised)."""
    start = time.perf_counter()
    try:
        yield row
    except BaseException:
        row["error"] = traceback.format_exc()[-1500:]
        raise
    finally:
        row["seconds"] = round(time.perf_counter() - start, 1)
        report(row)


def use_carried_fine_tunes():
    """Points `trained_models` at `KERAS_VLLM_TPU_FINE_TUNES`, if set, and
    has the carried models built on the host's CPU (each op of a model's
    first, eager call compiles on its own on the chip: ~50 s for Qwen 3.5)
    before their variables move to the chip."""
    from helpers import trained_models

    directory = os.environ.get("KERAS_VLLM_TPU_FINE_TUNES")
    if directory:
        trained_models.SHARED_DIR = os.path.abspath(directory)
        trained_models.BUILD_DEVICE = "cpu"
    return directory


def prepare_fine_tunes(directory, cases=CASES):
    """Fine-tunes every case into `directory` (run on any host)."""
    from helpers import trained_models

    trained_models.SHARED_DIR = os.path.abspath(directory)
    for family, overrides in cases:
        run = trained_models.training_run(family, **overrides)
        print(
            f"{case_id((family, overrides))}: losses {run.losses[0]:.2f} -> "
            f"{run.losses[-1]:.2f} ({run.fine_tune_seconds:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    # From the repository root: `PYTHONPATH=tests python -m
    # helpers.tpu_tier DIR [case id ...]`.
    wanted = set(sys.argv[2:])
    prepare_fine_tunes(
        sys.argv[1],
        [c for c in CASES if not wanted or case_id(c) in wanted],
    )
