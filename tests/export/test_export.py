"""Export -> artifact -> `load_causal_lm` round trips (no vLLM needed)."""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.load.keras_loader import check_golden
from keras_vllm.layers.swap import find_attention_layers
from keras_vllm.layers.swap import paged_class_for

from helpers.trained_models import trained


def _servable(causal_lm):
    return all(
        paged_class_for(layer) is not None
        for layer in find_attention_layers(causal_lm.backbone)
    )


def _inputs(causal_lm):
    ids = np.asarray([[5, 9, 17, 33, 65, 7, 11, 13]], dtype="int32")
    if causal_lm.preprocessor.tokenizer.start_token_id is not None:
        ids[0, 0] = causal_lm.preprocessor.tokenizer.start_token_id
    return testing.with_position_ids(
        causal_lm,
        {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)},
    )


# Export with golden outputs, Keras-side load and golden replay cost 10-45 s
# a family on 2 cores (Qwen 3.5's forward-pass references ~150 s). Every
# family's export is served and its goldens replayed on an engine in the CI
# tier (helpers/family_serving.py); this Keras-side round trip
# (`load_causal_lm`, which has no per-family code) runs there for tied and
# untied embeddings, routed experts, per-layer inputs with shared KV, nested
# decoders and a forward-pass reference, and for the others in `-m matrix`.
ROUND_TRIP_IN_CI = (
    "gpt2", "llama3", "mixtral", "gemma4_e2b", "gemma3n", "gpt_neo_x",
)


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(
            family,
            marks=() if family in ROUND_TRIP_IN_CI else pytest.mark.matrix,
        )
        for family in testing.FAMILIES
    ],
)
def test_round_trip_every_family(family, tmp_path):
    causal_lm = trained(family)
    path = causal_lm.export_vllm(
        tmp_path / "artifact",
        allow_unservable=not _servable(causal_lm),
        golden_prompts=testing.prompts(),
    )
    manifest = fmt.open_artifact(path).manifest
    assert manifest["weights"]["mode"] == "full"
    assert manifest["backbone"]["class_name"] == type(causal_lm.backbone).__name__
    # KerasHub's cached GPT-NeoX and Qwen 3.5 decoding is not their forward
    # pass, so their paged subclasses declare the forward pass as the
    # reference golden outputs are made with.
    want = (
        "forward_pass" if family in ("gpt_neo_x", "qwen3_5", "qwen3_5_moe")
        else "generate"
    )
    assert manifest["golden_reference"] == want
    loaded = keras_vllm.load_causal_lm(path)
    assert type(loaded) is type(causal_lm)
    x = _inputs(causal_lm)
    np.testing.assert_array_equal(
        np.asarray(loaded(x)), np.asarray(causal_lm(x))
    )
    assert check_golden(loaded, path) == []
    golden = json.load(open(os.path.join(path, fmt.GOLDEN_FILE)))
    outputs = {tuple(o["output_ids"]) for o in golden["outputs"]}
    assert len(outputs) > 1, "golden outputs do not depend on the prompt"


@pytest.fixture(scope="module")
def llama_preset(tmp_path_factory):
    """A local preset directory standing in for a hub preset."""
    import keras_hub

    directory = tmp_path_factory.mktemp("preset") / "tiny_llama"
    testing.save_tiny_preset(trained("llama"), str(directory))
    return str(directory)


def _from_preset(preset):
    import keras_hub

    causal_lm = keras_hub.models.CausalLM.from_preset(preset)
    causal_lm.compile(sampler="greedy")
    return causal_lm


def test_unchanged_model_stores_no_weights(llama_preset, tmp_path):
    causal_lm = _from_preset(llama_preset)
    path = causal_lm.export_vllm(tmp_path / "a")
    manifest = fmt.open_artifact(path).manifest
    assert manifest["preset"]["handle"] == llama_preset
    assert set(manifest["preset"]["files"]) >= {"config.json", "model.weights.h5"}
    assert manifest["weights"]["mode"] == "preset"
    assert not os.path.exists(os.path.join(path, fmt.WEIGHTS_DIR))
    loaded = keras_vllm.load_causal_lm(path)
    x = _inputs(causal_lm)
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(causal_lm(x)))


def _bytes(path):
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
    )


def test_delta_stores_only_changed_variables(llama_preset, tmp_path):
    causal_lm = _from_preset(llama_preset)
    kernel = next(
        v
        for v in causal_lm.backbone.weights
        if v.path == "transformer_layer_1/feedforward_output_dense/kernel"
    )
    kernel.assign(kernel.value * 1.5)
    delta = causal_lm.export_vllm(tmp_path / "delta")
    full = causal_lm.export_vllm(tmp_path / "full", weights="full")
    manifest = fmt.open_artifact(delta).manifest
    assert manifest["weights"]["mode"] == "delta"
    assert list(manifest["weights"]["variables"]) == [kernel.path]
    weights_ratio = _bytes(os.path.join(delta, "weights")) / _bytes(
        os.path.join(full, "weights")
    )
    print(f"delta/full weight bytes: {weights_ratio:.3f}")
    assert weights_ratio < 0.2
    x = _inputs(causal_lm)
    for path in (delta, full):
        loaded = keras_vllm.load_causal_lm(path)
        np.testing.assert_array_equal(
            np.asarray(loaded(x)), np.asarray(causal_lm(x))
        )
        assert check_golden(loaded, path) == []


def test_delta_refuses_changed_preset(llama_preset, tmp_path):
    causal_lm = _from_preset(llama_preset)
    causal_lm.backbone.weights[0].assign(causal_lm.backbone.weights[0] + 1.0)
    path = causal_lm.export_vllm(tmp_path / "delta")
    copy = str(tmp_path / "preset_copy")
    shutil.copytree(llama_preset, copy)
    weights_file = os.path.join(copy, "model.weights.h5")
    data = bytearray(open(weights_file, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(weights_file, "wb").write(bytes(data))
    with pytest.raises(keras_vllm.IntegrityError, match="model.weights.h5"):
        keras_vllm.load_causal_lm(path, preset=copy)
    with pytest.raises(keras_vllm.PresetUnavailableError, match="not available"):
        keras_vllm.load_causal_lm(path, preset=str(tmp_path / "nowhere"))


def test_lora_fine_tune_round_trip(tmp_path):
    causal_lm = testing.build_tiny_causal_lm("llama")
    causal_lm.backbone.enable_lora(rank=2)
    testing.fine_tune(causal_lm, steps=5)
    path = causal_lm.export_vllm(tmp_path / "lora")
    manifest = fmt.open_artifact(path).manifest
    assert manifest["weights"]["lora"] == "merged"
    assert not any("lora" in p for p in manifest["weights"]["variables"])
    loaded = keras_vllm.load_causal_lm(path)
    x = _inputs(causal_lm)
    np.testing.assert_allclose(
        np.asarray(loaded(x)), np.asarray(causal_lm(x)), atol=1e-5
    )
    assert check_golden(loaded, path) == []


def test_relative_preset_path_is_recorded_absolute(
    llama_preset, tmp_path, monkeypatch
):
    monkeypatch.chdir(os.path.dirname(llama_preset))
    causal_lm = _from_preset(os.path.basename(llama_preset))
    path = causal_lm.export_vllm(tmp_path / "a")
    assert fmt.open_artifact(path).manifest["preset"]["handle"] == llama_preset
    monkeypatch.chdir(tmp_path)
    loaded = keras_vllm.load_causal_lm(path)
    x = _inputs(causal_lm)
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(causal_lm(x)))


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_artifact_permissions_follow_the_umask(umask, tmp_path):
    previous = os.umask(umask)
    try:
        path = trained("gpt2").export_vllm(tmp_path / "a", golden_prompts=["a"])
    finally:
        os.umask(previous)
    for root, dirs, files in os.walk(path):
        for name in dirs + [""]:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            assert mode == 0o777 & ~umask, (os.path.join(root, name), oct(mode))
        for name in files:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            assert mode == 0o666 & ~umask, (os.path.join(root, name), oct(mode))
