"""Process-wide settings every keras-vllm entry point needs.

Imported first by `keras_vllm/__init__.py`, before keras is imported: Keras
picks its backend and NNX mode once, at import time. Nothing here starts
JAX (vLLM forks after plugins load, and a JAX runtime started before a fork
aborts the child).
"""

import os
import re

from keras_vllm import envs
from keras_vllm import logs

# Where an NVIDIA driver shows itself (the files JAX checks too).
_NVIDIA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia")
# ROCm's kernel driver node.
_AMD_DEVICE_FILES = ("/dev/kfd",)
# Distributions of JAX's GPU plugins (jax-cuda12-plugin, jax-rocm60-pjrt...).
_JAX_GPU_PLUGIN = re.compile(r"jax[-_.]?(cuda|rocm)\d*[-_.](plugin|pjrt)")


def jax_could_use_a_gpu():
    """Whether JAX could pick a GPU on this host.

    True when a GPU driver's device files exist and a JAX GPU plugin is
    installed; read from the file system and package metadata, without
    importing JAX.
    """
    files = _NVIDIA_DEVICE_FILES + _AMD_DEVICE_FILES
    if not any(os.path.exists(path) for path in files):
        return False
    from importlib import metadata

    return any(
        _JAX_GPU_PLUGIN.fullmatch((dist.metadata["Name"] or "").lower())
        for dist in metadata.distributions()
    )


def configure_environment():
    """Sets the JAX backend, NNX mode and data-parallel mode unless the
    user chose otherwise.

    On a host with neither a TPU nor a GPU that JAX could use, it also pins
    JAX to CPU devices, so that an installed libtpu does not probe for
    absent hardware on every start. A GPU stays JAX's to pick: a team
    fine-tuning on one imports keras-vllm for `export_vllm` too (an engine
    started here on such a host pins JAX to CPU itself,
    `keras_vllm.cpu.devices.pin_imported_jax_to_cpu`).
    """
    envs.KERAS_BACKEND.setdefault(envs.KERAS_BACKEND.default)
    envs.KERAS_NNX_ENABLED.setdefault(envs.KERAS_NNX_ENABLED.default)
    # `data_parallel_size` as one engine over a (data, model) mesh, the mode
    # tpu-inference gives `vllm.LLM` and the one tested here, for `vllm
    # serve` too (tpu-inference would start one engine per replica there).
    # Set at import, not per engine: it is an import-time variable to the
    # engine fork server (`serve/process/start.py`), which a later change
    # would make spawn every engine instead.
    envs.TPU_MULTIPROCESS_DP.setdefault("0")
    from keras_vllm.cpu.detect import is_cpu_host

    if _or_default(is_cpu_host, False) and not jax_could_use_a_gpu():
        from keras_vllm.cpu import devices

        # Also a JAX imported before keras-vllm (keras-hub first), which
        # read no JAX_PLATFORMS, as long as it has not started.
        devices.pin_imported_jax_to_cpu()
    if not _or_default(envs.VERBOSE.get, False):
        quiet_tensorflow()


def _or_default(read, default):
    """`read()`, or `default` when a variable it reads is malformed.

    A malformed variable fails where it is used (the CLI checks them all
    first and says so in one line), not at `import keras_vllm`, which has
    no caller to tell.
    """
    from keras_vllm.errors import ConfigurationError

    try:
        return read()
    except ConfigurationError:
        return default


def quiet_tensorflow():
    """Stops TensorFlow's start-up lines at their source, unless the user
    set the variables.

    keras-hub imports TensorFlow (its tokenizers build TF lookup tables),
    and TensorFlow 2.21 prints through absl before any Python logging
    exists: "oneDNN custom operations are on" (only `TF_ENABLE_ONEDNN_OPTS=0`
    stops it; keras-vllm computes in JAX, so TF's oneDNN kernels are
    unused), CPU-feature INFO lines (`TF_CPP_MIN_LOG_LEVEL=1`, which JAX
    sets as well) and, on a host without a CUDA driver, "failed call to
    cuInit ... (303)" when TF first lists its devices
    (`TF_ENABLED_DEVICE_TYPES=CPU`; set only where no NVIDIA GPU exists, so
    TensorFlow never loses a GPU it could use). Errors still show.
    """
    envs.TF_ENABLE_ONEDNN_OPTS.setdefault("0")
    envs.TF_CPP_MIN_LOG_LEVEL.setdefault("1")
    if not any(os.path.exists(path) for path in _NVIDIA_DEVICE_FILES):
        envs.TF_ENABLED_DEVICE_TYPES.setdefault("CPU")


_or_default(configure_environment, None)
_or_default(logs.install_false_alarm_filters, None)
