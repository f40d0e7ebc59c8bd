"""Where restored weights live, and where they are cast.

Orbax restores an artifact's weights onto the host's CPU device. Two things
went wrong with that on a TPU host, both reproduced here with two CPU
devices standing in for the host's CPU and the chip (in a subprocess: the
test process has one device):

- An engine builds its model inside tpu-inference's device mesh, where a
  JAX cast of those arrays is refused ("Received incompatible devices for
  jitted computation"): a float32 artifact served in bfloat16 failed to
  load on the chip. The cast is now made on the host.
- `load_causal_lm` returned a model whose variables stayed on the host's
  CPU device, so its `generate()` ran there (46 tok/s on the TPU host where
  the chip gives 1,331). They now move to JAX's default device.
- An int4 artifact failed to load on the chip the same way: placing the
  backbone on the runner's mesh asked each Dense / EinsumDense for its
  `kernel`, a property that unpacks Keras' packed 4-bit kernel eagerly
  (`serve/worker/sharding.py`). The placement rules now read the stored
  variable and the kernel's shape without computing it.

Cost: ~15 s, ~40 s (a tiny Llama exported and loaded in the subprocess)
and ~20 s (a tiny GPT-2 quantized to int4).
"""

import os
import subprocess
import sys
import textwrap

ENV = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    "KERAS_BACKEND": "jax",
}

CAST = textwrap.dedent(
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
    print("DONE")
    """
)

LOAD = textwrap.dedent(
    """
    import sys

    import jax

    import keras_vllm
    from keras_vllm import testing

    devices = jax.devices()
    assert len(devices) == 2, devices
    model = testing.build_tiny_causal_lm("llama")
    path = model.export_vllm(sys.argv[1], golden_prompts=[])
    want = model.generate("the quick", max_length=12)
    # The "chip": where JAX computes by default; orbax restores on cpu:0.
    jax.config.update("jax_default_device", devices[1])
    loaded = keras_vllm.load_causal_lm(path, verbose=False)
    placed = {d for v in loaded.backbone.variables for d in v.value.devices()}
    assert placed == {devices[1]}, placed
    assert loaded.generate("the quick", max_length=12) == want
    print("DONE")
    """
)

PLACE_INT4 = textwrap.dedent(
    """
    import jax
    import numpy as np

    from keras_vllm import testing
    from keras_vllm.serve.worker import sharding

    devices = jax.devices()
    assert len(devices) == 2, devices
    backbone = testing.build_tiny_causal_lm("gpt2").backbone
    backbone.quantize("int4")
    for variable in backbone.variables:  # as orbax restores them
        variable.assign(jax.device_put(variable.value, devices[0]))
    sizes = {role: 1 for role in sharding.ROLES}
    want = sharding.variable_axes(backbone, sizes)
    mesh = jax.sharding.Mesh(np.array([devices[1]]), ("model",))
    with jax.set_mesh(mesh):
        assert sharding.variable_axes(backbone, sizes) == want
    # Packed kernels stay whole; their scales follow the unpacked layout.
    packed = [v.path for v in backbone.variables
              if v.path.endswith("/kernel") and v.dtype == "int8"]
    assert packed and all(want[path] is None for path in packed), want
    print("DONE")
    """
)


def _run(script, *args):
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "DONE" in result.stdout, result.stderr[-3000:]


def test_a_cast_inside_another_devices_mesh_is_made_on_the_host():
    _run(CAST)


def test_a_loaded_model_computes_on_the_default_device(tmp_path):
    _run(LOAD, str(tmp_path / "artifact"))


def test_packed_int4_kernels_are_placed_without_unpacking():
    _run(PLACE_INT4)
