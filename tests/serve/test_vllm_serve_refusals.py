"""Plain `vllm serve DIR` on a directory keras-vllm cannot serve exits
with keras-vllm's one-line message, before vLLM reads any model config and
without starting an engine."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import keras_vllm
from helpers.trained_models import trained
from keras_vllm.serve.frontend import refusal_log
from keras_vllm.serve.frontend import refusals
from keras_vllm import testing

VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    preset = str(root / "preset")
    testing.save_tiny_preset(trained("gpt2"), preset)
    artifact = str(root / "artifact")
    keras_vllm.export_vllm(trained("gpt2"), artifact)
    tampered = str(root / "tampered")
    shutil.copytree(artifact, tampered)
    with open(os.path.join(tampered, "golden.json"), "a") as f:
        f.write(" ")
    empty = root / "empty"
    empty.mkdir()
    # A delta whose preset was moved away after the export.
    import keras_hub

    base = str(root / "base")
    testing.save_tiny_preset(trained("gpt2"), base)
    tuned = keras_hub.models.CausalLM.from_preset(base)
    kernel = tuned.backbone.weights[-1]
    kernel.assign(kernel.numpy() + 0.01)
    delta = keras_vllm.export_vllm(tuned, str(root / "delta"), golden_prompts=())
    moved = str(root / "base_moved")
    os.rename(base, moved)
    return {
        "empty": str(empty),
        "preset": preset,
        "tampered": tampered,
        "artifact": artifact,
        "delta": delta,
        "moved_preset": moved,
    }


def test_each_kind_of_directory_gets_its_own_message(dirs):
    assert "is empty" in refusals.refusal(dirs["empty"])
    preset = refusals.refusal(dirs["preset"])
    assert "KerasHub preset" in preset
    assert f"keras-vllm export {dirs['preset']} OUT" in preset
    assert "manifest.json" not in preset  # not the empty directory's line
    assert "IntegrityError" in refusals.refusal(dirs["tampered"])
    assert refusals.refusal(dirs["artifact"]) is None


def test_a_delta_whose_preset_is_not_here_is_refused(dirs, monkeypatch):
    monkeypatch.delenv("KERAS_VLLM_PRESET", raising=False)
    message = refusals.refusal(dirs["delta"])
    assert "PresetUnavailableError" in message
    assert "KERAS_VLLM_PRESET=DIR" in message  # the fix for plain vllm serve
    monkeypatch.setenv("KERAS_VLLM_PRESET", dirs["moved_preset"])
    assert refusals.refusal(dirs["delta"]) is None


def test_hugging_face_checkpoints_are_left_to_vllm(tmp_path):
    with open(tmp_path / "config.json", "w") as f:
        f.write('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    assert refusals.refusal(str(tmp_path)) is None


@pytest.mark.parametrize(
    "argv, model",
    [
        (["vllm", "serve", "{d}", "--port", "1"], "{d}"),
        (["/venv/bin/vllm", "serve", "--model={d}"], "{d}"),
        (["vllm", "serve", "--model", "{d}"], "{d}"),
        (["vllm", "serve", "Qwen/Qwen3-0.6B"], None),
        (["vllm", "bench", "{d}"], None),
        (["python", "serve", "{d}"], None),
    ],
)
def test_model_directory_from_the_command_line(tmp_path, argv, model):
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    want = model.replace("{d}", str(tmp_path)) if model else None
    assert refusals.model_directory(argv) == want


# Each case is a `vllm serve` process (~20 s of CI on 2 cores); every kind's
# message is also checked in-process above, so the CI tier runs two of them
# as processes and `-m matrix` the others.
@pytest.mark.parametrize("kind, says", [
    pytest.param("empty", "is empty", marks=pytest.mark.matrix),
    pytest.param("preset", "keras-vllm export", marks=pytest.mark.matrix),
    ("tampered", "IntegrityError"),
    ("delta", "KERAS_VLLM_PRESET=DIR"),
])
def test_plain_vllm_serve_refuses_before_an_engine_starts(dirs, kind, says):
    """One WARNING line on stderr names the route, the error and the fix
    (issue 52), and never the server's API key; the exit status is the
    preflight's (refused while vLLM reads its arguments, before any engine
    process)."""
    key = "refusal-test-key"
    result = subprocess.run(
        [VLLM, "serve", dirs[kind], "--port", "0", "--api-key", key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == refusals.EXIT_REFUSED, result.stderr[-3000:]
    (line,) = [
        line for line in result.stderr.splitlines() if "keras-vllm" in line
    ]
    assert line.startswith("WARNING keras-vllm refused vllm serve: "), line
    assert says in line
    assert "Traceback" not in result.stderr
    assert key not in result.stdout + result.stderr


# (directory, what the caller asks vLLM for): each refused before vLLM starts.
SHARED_REFUSALS = [
    ("tampered", {}),
    ("delta", {}),
    ("artifact", {"tensor_parallel_size": 3}),
    ("artifact", {"max_model_len": 1_000_000}),
    ("artifact", {"dtype": "int8"}),
    # Speculative decoding tpu-inference cannot run with a keras-vllm model.
    ("artifact", {"speculative_config": {
        "method": "draft_model", "model": "org/small",
        "num_speculative_tokens": 4}}),
    ("artifact", {"speculative_config": {
        "method": "ngram", "num_speculative_tokens": 4},
        "data_parallel_size": 2}),
]


def _flags(settings):
    flags = []
    for key, value in settings.items():
        value = json.dumps(value) if isinstance(value, dict) else str(value)
        flags += ["--" + key.replace("_", "-"), value]
    return flags


@pytest.mark.parametrize("name, settings", SHARED_REFUSALS)
def test_every_entry_point_refuses_with_the_same_words(
    dirs, name, settings, monkeypatch, capsys
):
    """`from_export`, `keras-vllm serve` and plain `vllm serve` run one
    preflight (`serve/preflight.py`): the same refusal, word for word."""
    import vllm

    from keras_vllm.cli.commands import main as cli

    def started(*args, **kwargs):
        raise AssertionError("vLLM started on an artifact it must refuse")

    monkeypatch.setattr(vllm, "LLM", started)
    monkeypatch.setattr(os, "execv", started)
    path = dirs[name]

    with pytest.raises(keras_vllm.KerasVllmError) as error:
        keras_vllm.KerasVllmEngine.from_export(path, **settings)
    expected = f"keras-vllm: {type(error.value).__name__}: {error.value}"
    capsys.readouterr()

    assert cli(["serve", path, *_flags(settings)]) == refusals.EXIT_REFUSED
    assert expected in capsys.readouterr().err

    monkeypatch.setattr(sys, "argv", ["vllm", "serve", path, *_flags(settings)])
    lines = []
    refused = refusal_log.refused
    monkeypatch.setattr(
        refusal_log, "refused",
        lambda *args, **kwargs: lines.append(refused(*args, **kwargs)),
    )
    with pytest.raises(SystemExit) as stopped:
        refusals.refuse_unservable_directory()
    assert stopped.value.code == refusals.EXIT_REFUSED
    assert lines == [expected.replace("keras-vllm:", "keras-vllm refused "
                                      "vllm serve:", 1)]
