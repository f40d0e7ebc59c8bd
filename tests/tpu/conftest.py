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


# KerasHub attention classes that hand their logit soft cap to
# `keras.ops.dot_product_attention` on a TPU.
_SOFT_CAPPED_ATTENTION = (
    ("keras_hub.src.models.gemma.gemma_attention", "CachedGemmaAttention"),
    ("keras_hub.src.models.gemma3.gemma3_attention", "CachedGemma3Attention"),
    ("keras_hub.src.models.gemma4.gemma4_attention", "Gemma4TextAttention"),
)


@pytest.fixture(scope="session", autouse=True)
def keras_reference_keeps_the_soft_cap():
    """The Keras reference computes a logit soft cap on the chip.

    On a TPU, KerasHub's Gemma attention passes its soft cap to
    `keras.ops.dot_product_attention`, and Keras 3.15.1 applies it only in
    the Splash kernel: for shapes Splash refuses (a query length that is not
    a multiple of 128, every decode step) it falls back to
    `jax.nn.dot_product_attention` without the cap
    (`keras/src/backend/jax/nn.py::dot_product_attention`; on a CPU the
    backend function gives exactly the uncapped result with
    `flash_attention=False`). Gemma 2's prompt logprobs were 0.07 off the
    engine's on the chip that way. Here the layers with a soft cap take
    KerasHub's explicit path (the one they take on a CPU).
    """
    import importlib

    with pytest.MonkeyPatch.context() as patch:
        for module_name, class_name in _SOFT_CAPPED_ATTENTION:
            cls = getattr(importlib.import_module(module_name), class_name)
            fused = cls._use_fused_attention_op

            def use_fused(self, fused=fused):
                if getattr(self, "logit_soft_cap", None) is not None:
                    return False
                return fused(self)

            patch.setattr(cls, "_use_fused_attention_op", use_fused)
        yield
