"""Restored weights cast to the dtype a model is rebuilt in.

Orbax restores an artifact's weights onto the host's CPU device, and an
engine builds its model inside tpu-inference's device mesh; on a TPU a JAX
cast of those arrays there is refused ("Received incompatible devices for
jitted computation"): a float32 artifact served in bfloat16 failed to load
on the chip. The same refusal happens on a CPU host with two devices (the
arrays on one, the mesh over the other), which is what this test builds,
in a subprocess (the test process has one device). Cost: ~15 s.
"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import types

    import jax
    import jax.numpy as jnp
    import numpy as np

    from keras_vllm.load import rebuild

    devices = jax.devices()
    assert len(devices) == 2, devices
    restored = {"w": jax.device_put(jnp.arange(6.0) / 3, devices[0])}
    variables = {"w": types.SimpleNamespace(dtype="bfloat16")}
    mesh = jax.sharding.Mesh(np.array([devices[1]]), ("model",))
    with jax.set_mesh(mesh):
        ((_, value),) = rebuild.cast_values(variables, restored)
    assert str(value.dtype) == "bfloat16", value.dtype
    # Back on the device orbax restored it to (the host's), not the mesh's.
    assert value.devices() == {devices[0]}, value.devices()
    want = np.asarray(jnp.arange(6.0, dtype="float32") / 3).astype("bfloat16")
    assert (np.asarray(value).view("uint16") == want.view("uint16")).all()
    print("CAST OK")
    """
)


def test_a_cast_inside_another_devices_mesh_is_made_on_the_host():
    env = {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "KERAS_BACKEND": "jax",
    }

    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "CAST OK" in result.stdout, result.stderr[-3000:]
