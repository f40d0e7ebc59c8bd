"""Process-wide settings every keras-vllm entry point needs.

Imported first by `keras_vllm/__init__.py`, before keras is imported: Keras
picks its backend and NNX mode once, at import time. Nothing here starts
JAX (vLLM forks after plugins load, and a JAX runtime started before a fork
aborts the child).
"""

from keras_vllm import envs
from keras_vllm import logs


def configure_environment():
    """Sets the JAX backend and NNX mode unless the user chose otherwise.

    On a host without a TPU it also pins JAX to CPU devices, so that an
    installed libtpu does not probe for absent hardware on every start.
    """
    envs.KERAS_BACKEND.setdefault(envs.KERAS_BACKEND.default)
    envs.KERAS_NNX_ENABLED.setdefault(envs.KERAS_NNX_ENABLED.default)
    from keras_vllm.cpu.detect import is_cpu_host

    if is_cpu_host():
        envs.JAX_PLATFORMS.setdefault("cpu")


configure_environment()
logs.install_false_alarm_filters()
