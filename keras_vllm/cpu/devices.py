"""Virtual JAX CPU devices for multi-device serving on a CPU host.

XLA's CPU client shows one device per process unless
`--xla_force_host_platform_device_count=N` is in `XLA_FLAGS` when JAX
creates its backend, and the count is fixed from then on. A tensor-parallel
engine on a CPU host therefore needs the flag set in its engine process
before that process starts JAX. vLLM finalizes its config (and so calls
`request_devices`, from the CPU backend's `check_and_update_config` patch) in
the process that then starts the engine process, which inherits the
environment: setting the variable there is early enough, and the user sets
nothing.
"""

import re

from keras_vllm import envs
from keras_vllm.errors import ServingError

_FLAG = "--xla_force_host_platform_device_count"
_FLAG_RE = re.compile(re.escape(_FLAG) + r"=(\d+)")


def forced_device_count(xla_flags=None):
    """The CPU device count `XLA_FLAGS` asks for (1 when it does not)."""
    flags = envs.XLA_FLAGS.raw() if xla_flags is None else xla_flags
    match = _FLAG_RE.search(flags or "")
    return int(match.group(1)) if match else 1


def with_device_count(xla_flags, count):
    """`xla_flags` with the CPU device count set to `count`."""
    flags = _FLAG_RE.sub("", xla_flags or "").split()
    return " ".join(flags + [f"{_FLAG}={count}"])


def pin_imported_jax_to_cpu():
    """Points an imported JAX that has not started at its CPU devices.

    JAX reads `JAX_PLATFORMS` once, when it is imported. A process that
    imported JAX before the variable was set (keras-hub imported before
    keras-vllm, or a GPU host, where keras-vllm leaves JAX's platforms to
    the user) would start its engine process's JAX on other platforms:
    libtpu probing for absent TPUs, or a GPU that the CPU backend does not
    serve on. A started JAX, or platforms the user chose, are left alone.
    """
    import sys

    if not envs.jax_platforms():
        envs.JAX_PLATFORMS.set("cpu")
    if "jax" not in sys.modules:
        return
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized() and not (
        jax.config.jax_platforms
    ):
        jax.config.update("jax_platforms", envs.jax_platforms())


def _running_cpu_devices():
    """The CPU device count of this process's JAX, or None if not started."""
    import sys

    if "jax" not in sys.modules:
        return None
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return None
    import jax

    return len(jax.devices("cpu"))


def request_devices(count, engine_in_this_process):
    """Makes `count` JAX CPU devices available to vLLM's engine.

    Args:
        count: devices the engine's mesh needs (tensor x data parallel).
        engine_in_this_process: whether the engine runs in this process
            (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) rather than in one vLLM
            starts.

    Raises:
        ServingError: the engine runs in this process, which already started
            JAX with fewer devices (the count cannot change any more).
    """
    if count <= 1:
        return
    running = _running_cpu_devices()
    if engine_in_this_process and running is not None and running < count:
        raise ServingError(
            f"Serving on {count} devices needs {count} JAX CPU devices, but "
            f"this process already started JAX with {running} and runs the "
            "engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), where the "
            "count can no longer change. Unset "
            "VLLM_ENABLE_V1_MULTIPROCESSING (the engine process then gets its "
            f"own devices), or set XLA_FLAGS={_FLAG}={count} before this "
            "process imports JAX."
        )
    if forced_device_count() < count:
        envs.XLA_FLAGS.set(with_device_count(envs.XLA_FLAGS.raw(), count))
