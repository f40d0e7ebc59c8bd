"""What every CPU patch asks: is JAX up, and are these devices CPUs?

A leaf of `keras_vllm.cpu` (no other keras-vllm imports), so the patch
modules can share it. Replacing functions is `keras_vllm.patching`'s job.
"""


# They run when a patched function is called, i.e. inside the engine's
# worker, where JAX is (being) initialized anyway; never at install time.


def jax_initialized():
    """Whether this process has created its JAX backends."""
    from jax._src import xla_bridge
    return xla_bridge.backends_are_initialized()


def all_cpu(devices=None):
    """Whether `devices` (default: JAX's) are all CPU devices."""
    import jax
    devices = jax.devices() if devices is None else list(devices)
    return bool(devices) and all(d.platform == "cpu" for d in devices)
