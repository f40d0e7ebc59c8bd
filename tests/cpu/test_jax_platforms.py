"""Which devices JAX gets in a process that imports keras-vllm.

A host without a TPU or a usable GPU pins JAX to CPU devices (an installed
libtpu would otherwise probe for absent TPUs); a GPU that JAX could use
stays JAX's, for the fine-tune that exports. Before an engine starts on a
CPU host, a JAX imported earlier (before `JAX_PLATFORMS` was set) is
pointed at its CPU devices, without starting it.
"""

import os
import subprocess
import sys
import textwrap
import types

import pytest

from keras_vllm import _env


def _fake_distributions(*names):
    return lambda: [types.SimpleNamespace(metadata={"Name": n}) for n in names]


@pytest.fixture
def gpu_host(monkeypatch, tmp_path):
    """A host whose GPU driver files exist (a temporary file stands in)."""
    driver = tmp_path / "nvidiactl"
    driver.write_text("")
    monkeypatch.setattr(_env, "_NVIDIA_DEVICE_FILES", (str(driver),))
    monkeypatch.setattr(_env, "_AMD_DEVICE_FILES", ())
    return monkeypatch


@pytest.mark.parametrize(
    "plugins, usable",
    [
        (("numpy", "jax-cuda12-plugin", "jax-cuda12-pjrt"), True),
        (("jax_rocm60_plugin",), True),
        (("jax", "jaxlib", "libtpu"), False),  # no GPU plugin: CPU only
    ],
)
def test_a_gpu_counts_when_jax_has_a_plugin_for_it(gpu_host, plugins, usable):
    from importlib import metadata

    gpu_host.setattr(metadata, "distributions", _fake_distributions(*plugins))
    assert _env.jax_could_use_a_gpu() is usable


def test_no_gpu_driver_means_no_gpu(monkeypatch, tmp_path):
    from importlib import metadata

    monkeypatch.setattr(_env, "_NVIDIA_DEVICE_FILES", (str(tmp_path / "x"),))
    monkeypatch.setattr(_env, "_AMD_DEVICE_FILES", ())
    monkeypatch.setattr(
        metadata, "distributions", _fake_distributions("jax-cuda12-plugin")
    )
    assert not _env.jax_could_use_a_gpu()


@pytest.mark.parametrize("gpu, pinned", [(True, None), (False, "cpu")])
def test_jax_is_pinned_to_cpu_only_without_a_usable_gpu(gpu_host, gpu, pinned):
    for name in ("KERAS_BACKEND", "KERAS_NNX_ENABLED", "TF_ENABLE_ONEDNN_OPTS",
                 "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLED_DEVICE_TYPES"):
        gpu_host.setenv(name, os.environ.get(name, ""))
    gpu_host.delenv("JAX_PLATFORMS", raising=False)
    gpu_host.setenv("KERAS_VLLM_DEVICE", "cpu")  # no TPU here
    gpu_host.setattr(_env, "jax_could_use_a_gpu", lambda: gpu)
    _env.configure_environment()
    assert os.environ.get("JAX_PLATFORMS") == pinned


_PIN = textwrap.dedent(
    """
    import jax  # before keras-vllm: JAX_PLATFORMS was unset when JAX read it
    from jax._src import xla_bridge
    if START:
        jax.devices()
    before = jax.config.jax_platforms
    from keras_vllm.cpu import devices
    devices.pin_imported_jax_to_cpu()
    print("PIN", before, jax.config.jax_platforms,
          xla_bridge.backends_are_initialized(), os.environ["JAX_PLATFORMS"])
    """
)


@pytest.mark.parametrize("start", [False, True])
def test_an_imported_jax_is_pointed_at_cpu_before_an_engine(start):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = f"import os\nSTART = {start}\n" + _PIN
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True,
        text=True, timeout=300,
    )
    line = [l for l in result.stdout.splitlines() if l.startswith("PIN ")]
    assert line, result.stderr[-3000:]
    before, after, started, variable = line[0].split()[1:]
    assert before == "None" and variable == "cpu"
    if start:
        # JAX already runs: its devices cannot change; engine processes
        # start clean with the variable.
        assert (after, started) == ("None", "True")
    else:
        # Pointed at CPU, still not started (vLLM may fork after this).
        assert (after, started) == ("cpu", "False")


def test_importing_keras_vllm_pins_a_jax_imported_before_it():
    # keras-hub first, as training scripts import it: JAX is imported, not
    # started; on this host (no TPU, no GPU) it must not probe libtpu later.
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = (
        "import jax\nimport keras_vllm\n"
        "from jax._src import xla_bridge\n"
        "print('PLATFORMS', jax.config.jax_platforms,"
        " xla_bridge.backends_are_initialized())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True,
        text=True, timeout=300,
    )
    assert "PLATFORMS cpu False" in result.stdout, result.stderr[-3000:]
