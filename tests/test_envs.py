"""keras_vllm.envs: defaults, parsing at call time, clear errors."""

import pathlib
import subprocess
import sys

import pytest

from keras_vllm import envs

_OWN = [v for v in envs.VARIABLES if v.name.startswith("KERAS_VLLM_")]


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    for variable in envs.VARIABLES:
        if variable not in (envs.KERAS_BACKEND, envs.KERAS_NNX_ENABLED):
            monkeypatch.delenv(variable.name, raising=False)


def test_defaults_when_unset_or_empty(monkeypatch):
    defaults = {
        envs.DEVICE.get: None,
        envs.CPU_MEMORY_GB.get: 4.0,
        envs.CPU_ASYNC_SCHEDULING.get: True,
        envs.VERBOSE.get: False,
        envs.PROGRESS.get: "auto",
        envs.ENGINE_PROGRESS.get: None,
        envs.MAX_PARAMETERS.get: 1 << 34,
        envs.MOE_EXPERTS.get: "routed",
    }
    assert {read: read() for read in defaults} == defaults
    for variable in _OWN:
        monkeypatch.setenv(variable.name, "  ")
    assert {read: read() for read in defaults} == defaults
    assert not envs.in_ci()


def test_values_are_read_at_call_time(monkeypatch):
    monkeypatch.setenv(envs.DEVICE.name, " TPU ")
    monkeypatch.setenv(envs.CPU_MEMORY_GB.name, "0.5")
    monkeypatch.setenv(envs.CPU_ASYNC_SCHEDULING.name, "off")
    monkeypatch.setenv(envs.VERBOSE.name, "yes")
    monkeypatch.setenv(envs.PROGRESS.name, "0")
    monkeypatch.setenv(envs.ENGINE_PROGRESS.name, "lines")
    monkeypatch.setenv(envs.MAX_PARAMETERS.name, "1e10")
    assert envs.DEVICE.get() == "tpu"
    assert envs.CPU_MEMORY_GB.get() == 0.5
    assert envs.CPU_ASYNC_SCHEDULING.get() is False
    assert envs.VERBOSE.get() is True
    assert envs.PROGRESS.get() is False
    assert envs.ENGINE_PROGRESS.get() == "lines"
    assert envs.MAX_PARAMETERS.get() == 10**10
    monkeypatch.setenv(envs.PROGRESS.name, "Lines")
    assert envs.PROGRESS.get() == "lines"


@pytest.mark.parametrize(
    "variable, value",
    [
        (envs.DEVICE, "gpu"),
        (envs.CPU_MEMORY_GB, "four"),
        (envs.CPU_MEMORY_GB, "-1"),
        (envs.CPU_MEMORY_GB, "nan"),
        (envs.CPU_ASYNC_SCHEDULING, "maybe"),
        (envs.VERBOSE, "2"),
        (envs.PROGRESS, "sometimes"),
        (envs.ENGINE_PROGRESS, "bars"),
        (envs.MAX_PARAMETERS, "0"),
        (envs.MAX_PARAMETERS, "lots"),
        (envs.MAX_PARAMETERS, "inf"),
        (envs.MOE_EXPERTS, "sparse"),
    ],
)
def test_malformed_values_name_the_variable_and_what_it_accepts(
    monkeypatch, variable, value
):
    from keras_vllm.errors import ConfigurationError

    monkeypatch.setenv(variable.name, value)
    with pytest.raises(ConfigurationError) as raised:  # a ValueError too
        variable.get()
    message = str(raised.value)
    assert message.startswith(f"{variable.name}={value!r} is not valid; ")
    assert variable.accepts in message


def test_malformed_device_is_refused_by_the_detection(monkeypatch):
    from keras_vllm.cpu import detect

    monkeypatch.setenv(envs.DEVICE.name, "gpu")
    with pytest.raises(ValueError, match="KERAS_VLLM_DEVICE='gpu'"):
        detect.is_cpu_host()
    monkeypatch.setenv(envs.DEVICE.name, "cpu")
    assert detect.is_cpu_host()


def test_ci_and_dumb_terminals(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert envs.in_ci()
    monkeypatch.delenv("CI")
    monkeypatch.setenv("TERM", "dumb")
    assert envs.in_ci()


def test_every_variable_is_declared_once_and_documented():
    names = [variable.name for variable in envs.VARIABLES]
    assert len(names) == len(set(names))
    handoff = pathlib.Path(__file__).parents[1] / "docs" / "HANDOFF.md"
    text = handoff.read_text()
    assert [v.name for v in _OWN if f"`{v.name}`" not in text] == []
    for variable in envs.VARIABLES:
        assert variable.meaning and variable.readers and variable.accepts


def test_importing_envs_imports_only_the_standard_library():
    # vLLM's processes import it before JAX starts: it must stay a leaf.
    code = (
        "import importlib.util, os, sys; before = set(sys.modules);"
        "spec = importlib.util.spec_from_file_location('envs', os.environ['F']);"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec));"
        "print(sorted(set(sys.modules) - before))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"F": envs.__file__},
    )
    assert result.stdout.strip() == "[]", result.stdout
