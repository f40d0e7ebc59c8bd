"""The TPU tier: served families checked on a real TPU against Keras on the
same chip.

Its modules mark their tests `tpu`: README's test command deselects them (a
CPU host has no chip, and under `-n 2` two processes would contend for one),
and `pytest -m tpu tests/tpu` runs them, skipping each with the reason where
no TPU is visible. They run in one process: one program holds a TPU chip at
a time, so each engine runs in the test process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) beside its Keras reference.
"""

import pytest

from keras_vllm.cpu import detect


def pytest_collection_modifyitems(config, items):
    if not detect.is_cpu_host():
        return
    skip = pytest.mark.skip(
        reason="needs a TPU (none visible here; KERAS_VLLM_DEVICE=tpu "
        "overrides the detection)"
    )
    for item in items:
        if item.get_closest_marker("tpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def engine_in_this_process():
    """Engines run in the test process, which holds the chip."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


@pytest.fixture
def highest_precision():
    """Float32 matmuls at full precision on the chip, for the engine (it
    traces its programs in this process) and the Keras reference alike.

    A TPU's default float32 matmul takes bfloat16 passes; two programs that
    group a sum differently then drift apart within a few tokens (seen on a
    125M model: 13 of 128 tokens equal). At "highest" both compute float32.
    """
    import jax

    previous = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")
    yield "highest"
    jax.config.update("jax_default_matmul_precision", previous)
