"""What every CPU patch needs: device checks and rebinding by name.

A leaf of `keras_vllm.cpu` (no other keras-vllm imports), so the patch
modules can share it.
"""

import sys

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


def rebind(original, replacement, home_module, name):
    """Replaces `original` in its home module and in every loaded
    tpu_inference module that imported it by name (`from m import f` binds
    the object, so patching only the home module would not reach them)."""
    setattr(home_module, name, replacement)
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("tpu_inference"):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
