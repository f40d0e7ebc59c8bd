"""Bad input gets a clear error of the package's own type; nothing on disk
is lost. No vLLM engine is started: engine-side refusals happen before it.
"""

import os
import shutil
import subprocess
import sys
import types

import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing


@pytest.fixture(scope="module")
def causal_lm():
    return testing.build_tiny_causal_lm("llama")


def _export(model, path, **kwargs):
    kwargs.setdefault("golden_prompts", ("The",))
    kwargs.setdefault("golden_max_new_tokens", 2)
    return model.export_vllm(path, **kwargs)


@pytest.fixture(scope="module")
def good(causal_lm, tmp_path_factory):
    return _export(causal_lm, tmp_path_factory.mktemp("good") / "llama")


def _snapshot(path):
    """Every file under `path` with its bytes."""
    result = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                result[os.path.relpath(full, path)] = f.read()
    return result


@pytest.fixture
def no_vllm(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the refusal should have come before vLLM")

    fake = types.ModuleType("vllm")
    fake.LLM = refuse
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from keras_vllm.serve import plugin

    monkeypatch.setattr(plugin, "register", refuse)


# --------------------------------------------------------------------------
# Export: bad models.
# --------------------------------------------------------------------------


def test_backbone_is_not_a_causal_lm(causal_lm, tmp_path):
    with pytest.raises(keras_vllm.UnsupportedModelError, match="takes a keras_hub.models.CausalLM, got LlamaBackbone"):
        keras_vllm.export_vllm(causal_lm.backbone, tmp_path / "a")
    assert os.listdir(tmp_path) == []


def test_keras_model_is_not_a_causal_lm(tmp_path):
    import keras

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(keras_vllm.UnsupportedModelError, match="got Functional"):
        keras_vllm.export_vllm(model, tmp_path / "a")
    assert os.listdir(tmp_path) == []


def test_unknown_backbone_class(causal_lm, tmp_path):
    import keras
    import keras_hub

    @keras.saving.register_keras_serializable(package="my_package")
    class MyBackbone(keras_hub.models.LlamaBackbone):
        pass

    backbone = MyBackbone.from_config(causal_lm.backbone.get_config())
    model = keras_hub.models.LlamaCausalLM(
        backbone=backbone, preprocessor=causal_lm.preprocessor
    )
    with pytest.raises(
        keras_vllm.UnsupportedModelError, match="MyBackbone, not a class registered by keras-hub"
    ):
        model.export_vllm(tmp_path / "a")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------
# Export: bad targets. Nothing on disk is lost.
# --------------------------------------------------------------------------


def test_existing_path_without_overwrite(causal_lm, good):
    before = _snapshot(good)
    with pytest.raises(keras_vllm.ExportError, match="already exists. Pass `overwrite=True`"):
        causal_lm.export_vllm(good)
    assert _snapshot(good) == before


def test_target_is_a_file(causal_lm, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("keep me")
    with pytest.raises(keras_vllm.ExportError, match="exists and is not a directory"):
        causal_lm.export_vllm(target, overwrite=True)
    assert target.read_text() == "keep me"


def test_parent_is_a_file(causal_lm, tmp_path):
    parent = tmp_path / "a_file"
    parent.write_text("keep me")
    with pytest.raises(keras_vllm.ExportError, match="is not a directory"):
        causal_lm.export_vllm(parent / "artifact")
    assert parent.read_text() == "keep me"


def test_missing_parents_are_created(causal_lm, tmp_path):
    """README's `export_vllm("exports/tuned")` on a fresh directory: the
    missing parents are created, as `save_to_preset` creates them."""
    target = tmp_path / "exports" / "run1" / "tuned"
    path = _export(causal_lm, target)
    assert path == str(target)
    assert os.path.isfile(target / fmt.MANIFEST_FILE)


def test_ancestor_is_a_file(causal_lm, tmp_path):
    (tmp_path / "a_file").write_text("keep me")
    with pytest.raises(keras_vllm.ExportError, match="is not a directory"):
        causal_lm.export_vllm(tmp_path / "a_file" / "sub" / "artifact")
    assert (tmp_path / "a_file").read_text() == "keep me"


def test_unwritable_directory_read_only_mount(causal_lm, tmp_path):
    """A read-only filesystem refuses writes even to root."""
    mount = str(tmp_path / "ro")
    os.makedirs(mount)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", mount],
        capture_output=True,
    )
    if result.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        with pytest.raises(keras_vllm.ExportError, match="staging directory|not writable") as info:
            causal_lm.export_vllm(os.path.join(mount, "artifact"))
        print("\nread-only:", info.value)
        assert os.listdir(mount) == []
    finally:
        subprocess.run(["umount", mount], capture_output=True)


def test_unwritable_directory_permission_check(causal_lm, tmp_path, monkeypatch):
    """The permission check itself (root bypasses mode bits, so `os.access`
    is stubbed to answer as it would for an ordinary user)."""
    target = tmp_path / "locked" / "artifact"
    os.makedirs(target.parent)
    os.chmod(target.parent, 0o555)
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda p, mode, **kw: False
        if os.path.abspath(p) == str(target.parent)
        else real_access(p, mode, **kw),
    )
    with pytest.raises(keras_vllm.ExportError, match="is not writable"):
        causal_lm.export_vllm(target)
    assert os.listdir(target.parent) == []


# --------------------------------------------------------------------------
# Corrupt or incomplete artifacts.
# --------------------------------------------------------------------------


def test_incomplete_artifact_without_manifest(good, tmp_path):
    copy = str(tmp_path / "incomplete")
    shutil.copytree(good, copy)
    os.remove(os.path.join(copy, fmt.MANIFEST_FILE))
    for load in (keras_vllm.load_causal_lm, fmt.open_artifact):
        with pytest.raises(keras_vllm.ArtifactError, match="export did not finish"):
            load(copy)


def test_not_a_directory(tmp_path):
    with pytest.raises(keras_vllm.ArtifactError, match="is not a directory"):
        keras_vllm.load_causal_lm(tmp_path / "nothing")


def test_flipped_byte_in_every_file_is_detected(good, tmp_path):
    manifest = fmt.open_artifact(good).manifest
    names = sorted(manifest["files"])
    assert any(n.startswith("weights/") for n in names)
    assert any(n.startswith("tokenizer/assets/") for n in names)
    detected = []
    for i, rel in enumerate(names):
        copy = str(tmp_path / f"copy{i}")
        shutil.copytree(good, copy)
        path = os.path.join(copy, rel)
        size = os.path.getsize(path)
        assert size > 0, rel
        with open(path, "r+b") as f:
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0x80]))
        with pytest.raises(keras_vllm.IntegrityError) as info:
            fmt.open_artifact(copy).manifest
        assert f"'{rel}'" in str(info.value)
        assert "SHA-256" in str(info.value)
        detected.append(rel)
        shutil.rmtree(copy)
    print(f"\nflipped byte detected in all {len(detected)} files")


# --------------------------------------------------------------------------
# Serving refusals, before vLLM's profiling run.
# --------------------------------------------------------------------------


def test_max_model_len_beyond_positions(good, no_vllm):
    from keras_vllm.serve.engine.engine import KerasVllmEngine

    manifest = fmt.open_artifact(good).manifest
    positions = manifest["max_sequence_length"]
    with pytest.raises(
        keras_vllm.ServingError, match=f"exceeds the {positions} positions"
    ):
        KerasVllmEngine.from_export(good, max_model_len=positions + 1)


def test_unservable_dtype(good, no_vllm):
    from keras_vllm.serve.engine.engine import KerasVllmEngine

    with pytest.raises(keras_vllm.ServingError, match="dtype='int8' cannot serve"):
        KerasVllmEngine.from_export(good, dtype="int8")


def test_delta_artifact_with_unavailable_preset(causal_lm, tmp_path, no_vllm):
    import keras_hub

    from keras_vllm.serve.engine.engine import KerasVllmEngine

    preset = testing.save_tiny_preset(causal_lm, tmp_path / "tiny_preset")
    model = keras_hub.models.CausalLM.from_preset(preset)
    model.compile(sampler="greedy")
    variable = model.backbone.weights[0]
    variable.assign(variable.value * 2.0)
    path = _export(model, tmp_path / "delta")
    assert fmt.open_artifact(path).manifest["weights"]["mode"] == "delta"
    moved = str(tmp_path / "moved_preset")
    os.rename(preset, moved)
    try:
        with pytest.raises(keras_vllm.PresetUnavailableError) as info:
            keras_vllm.load_causal_lm(path)
        assert f"'{preset}'" in str(info.value)
        assert "preset=" in str(info.value)
        with pytest.raises(keras_vllm.PresetUnavailableError) as info:
            KerasVllmEngine.from_export(path)
        message = str(info.value)
        print("\nengine:", message)
        assert f"'{preset}'" in message
        assert "offline" in message and "copy the preset directory" in message
        # With the preset given explicitly, the Keras side loads.
        keras_vllm.load_causal_lm(path, preset=moved)
    finally:
        os.rename(moved, preset)
