"""Hostile adapters, quantized values and weights tables refused with
keras-vllm errors through the entry points users call (issue 40), before
any engine starts: `KerasVllmEngine.from_export(base, adapters=...)`,
`load_causal_lm`, and the `keras-vllm` CLI (`verify`, `inspect`).

The cases are `helpers/hostile_served.py`'s; each is a copy of a good
export edited with its checksums rewritten. No engine starts here (the
served side is `test_hardened_server.py`).
"""

import contextlib
import io
import os
import re
import shutil

import pytest

import keras_vllm
from keras_vllm import cli
from keras_vllm.serve.process import start as engine_process
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import KerasVllmError

from helpers import hostile_served
from helpers import lora_exports
from helpers import quantized_models
from helpers.trained_models import trained


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    return lora_exports.exports(tmp_path_factory)


@pytest.fixture(scope="module")
def int8_artifact(tmp_path_factory):
    model = quantized_models.quantized("llama", "int8")
    return str(model.export_vllm(
        tmp_path_factory.mktemp("int8") / "int8",
        golden_prompts=["the"], golden_max_new_tokens=2,
    ))


@pytest.fixture(scope="module")
def full_artifact(tmp_path_factory):
    return str(trained("gpt2").export_vllm(
        tmp_path_factory.mktemp("full") / "gpt2",
        golden_prompts=["the"], golden_max_new_tokens=2,
    ))


def _copy(source, tmp_path, name):
    return str(shutil.copytree(source, tmp_path / name))


@pytest.fixture
def sibling(adapters):
    """Copies of the support adapter beside it (its base is recorded by a
    relative path); removed afterwards."""
    made = []

    def copy(name):
        source = adapters["paths"]["support"]
        path = os.path.join(os.path.dirname(source), f"hostile_{name}")
        shutil.rmtree(path, ignore_errors=True)
        made.append(shutil.copytree(source, path))
        return str(path)

    yield copy
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _no_engine(monkeypatch):
    def refuse():
        raise AssertionError("vLLM was about to start")

    monkeypatch.setattr(engine_process, "choose", refuse)


def _cli(*argv):
    """`keras-vllm ARGV` in this process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(argv))
    return code, err.getvalue()


def _refused_by_cli(path, message, command="verify"):
    code, stderr = _cli(command, path)
    assert code == cli.EXIT_REFUSED, stderr
    assert "keras-vllm: " in stderr and "Traceback" not in stderr
    assert re.search(message, stderr), stderr


@pytest.mark.parametrize("case", sorted(hostile_served.ADAPTER_CASES))
def test_a_damaged_adapter_is_refused_at_start(
    case, adapters, sibling, monkeypatch
):
    """Checked completely (stored factor dtypes and shapes) before vLLM
    starts: it used to pass and stop the engine at its first request."""
    edit, message = hostile_served.ADAPTER_CASES[case]
    path = sibling(case)
    edit(path)
    _no_engine(monkeypatch)
    with pytest.raises(ArtifactError, match=message) as raised:
        keras_vllm.KerasVllmEngine.from_export(
            adapters["base"], adapters={"bad": path}
        )
    assert path in str(raised.value)
    with pytest.raises(ArtifactError, match=message):
        keras_vllm.load_causal_lm(path)
    _refused_by_cli(path, message)


def test_an_adapter_whose_base_has_no_manifest(adapters, tmp_path):
    path = _copy(adapters["paths"]["support"], tmp_path, "adapter")
    hostile_served.base_without_manifest(path, str(tmp_path / "not_a_base"))
    with pytest.raises(ArtifactError, match="no readable manifest.json"):
        keras_vllm.load_causal_lm(path)
    _refused_by_cli(path, "no readable manifest.json")


@pytest.mark.parametrize("case", sorted(hostile_served.MANIFEST_CASES))
def test_a_weights_table_without_its_fields(case, full_artifact, tmp_path):
    edit, message = hostile_served.MANIFEST_CASES[case]
    path = _copy(full_artifact, tmp_path, case)
    edit(path)
    with pytest.raises(ArtifactError, match=message):
        keras_vllm.load_causal_lm(path)
    _refused_by_cli(path, message)
    _refused_by_cli(path, message, "inspect")


@pytest.mark.parametrize(
    "case", sorted(hostile_served.QUANTIZED_VALUE_CASES)
)
def test_quantized_metadata_and_scales_are_checked_at_load(
    case, int8_artifact, tmp_path
):
    edit, message = hostile_served.QUANTIZED_VALUE_CASES[case]
    path = _copy(int8_artifact, tmp_path, case)
    edit(path)
    with pytest.raises(KerasVllmError, match=message):
        keras_vllm.load_causal_lm(path)
    _refused_by_cli(path, message)


def test_the_good_exports_still_load(adapters, int8_artifact, full_artifact):
    for path in (adapters["paths"]["support"], int8_artifact, full_artifact):
        assert keras_vllm.load_causal_lm(path) is not None


_CHECK_WITHOUT_JAX = """
import sys
from keras_vllm import format as fmt
from keras_vllm.load import adapter_checks
path, base = sys.argv[1:3]
adapter_checks.check_adapter(
    adapter_checks.open_adapter(path), fmt.open_artifact(base, verify=False), 8
)
from jax._src import xla_bridge
print("BACKEND", xla_bridge.backends_are_initialized())
"""


def test_the_complete_adapter_check_starts_no_jax_backend(adapters):
    """It runs in vLLM's API server and an engine's parent, which must
    leave the accelerator to the engine process."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CHECK_WITHOUT_JAX,
         adapters["paths"]["legal"], adapters["base"]],
        capture_output=True, text=True, timeout=300,
    )
    assert "BACKEND False" in done.stdout, done.stderr[-3000:]
