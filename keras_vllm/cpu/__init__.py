"""The CPU backend: vLLM's TPU backend (tpu-inference) on JAX CPU devices.

`is_cpu_host()` decides, without initializing JAX, whether this host should
serve on CPU; `apply_patches()` makes vllm-tpu / tpu-inference 0.32.0 run
there (memory accounting, device mesh, a pure-JAX ragged paged attention,
XLA:TPU-only compiler options, async scheduling). Nothing here imports keras
or keras_hub.
"""

from keras_vllm.cpu.detect import is_cpu_host
from keras_vllm.cpu.detect import platform_class_path


def apply_patches():
    """Makes vllm-tpu / tpu-inference run on JAX CPU devices (see
    `keras_vllm.cpu.patches.apply_patches`)."""
    # Imported here, not above: the patches import JAX, and
    # `keras_vllm._env` imports this package to decide JAX_PLATFORMS before
    # JAX is first imported (JAX reads it once, at import).
    from keras_vllm.cpu import patches

    return patches.apply_patches()


__all__ = ["apply_patches", "is_cpu_host", "platform_class_path"]
