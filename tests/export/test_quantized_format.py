"""Keras-quantized models in the artifact: sizes, bit-exact round trips,
delta exports against the float preset, refusals and hostile edits.

No engine here (`test_quantized_serving.py` serves them).
"""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vllm
from helpers import quantized_models
from helpers.trained_models import trained_copy
from keras_vllm import format as fmt
from keras_vllm.cli import inspect_artifact
from keras_vllm import testing
from keras_vllm.hub import checkpoint
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.load import rebuild
from keras_vllm.load import update_checks

PROMPTS = testing.prompts()[:2]


def _export(causal_lm, path, **kwargs):
    return causal_lm.export_vllm(
        str(path), golden_prompts=PROMPTS[:1], golden_max_new_tokens=4, **kwargs
    )


@pytest.fixture(scope="module")
def int8_artifact(tmp_path_factory):
    model = quantized_models.quantized("llama", "int8")
    return _export(model, tmp_path_factory.mktemp("q") / "int8")


def _manifest(path):
    with open(os.path.join(path, fmt.MANIFEST_FILE)) as f:
        return json.load(f)


def test_int8_weights_are_under_30_percent_of_float32(int8_artifact, tmp_path):
    full = _export(trained_copy("llama"), tmp_path / "float")
    quantized_bytes = _manifest(int8_artifact)["weights"]["bytes"]
    float_bytes = _manifest(full)["weights"]["bytes"]
    print(f"\nint8 / float32 weight bytes: {quantized_bytes / float_bytes:.3f}")
    assert quantized_bytes <= 0.30 * float_bytes


@pytest.mark.parametrize(
    "mode, config, problem",
    [
        ("int4", dict(block_size=None, activation_quantizer="abs_max"), "with its inputs quantized"),
        # Quantizing a second model costs ~1 minute of CI: the same refusal
        # for the other mode is in `-m matrix`.
        pytest.param(
            "int8", dict(activation_quantizer=None), "weights-only",
            marks=pytest.mark.matrix,
        ),
    ],
)
def test_non_default_activation_quantization_is_refused(
    mode, config, problem, tmp_path
):
    # A policy name does not say whether a layer quantizes its inputs, so
    # the loader rebuilds Keras' default for the mode; any other choice is
    # refused at export rather than served differently.
    from keras import quantizers

    if config.get("activation_quantizer") == "abs_max":
        config["activation_quantizer"] = quantizers.AbsMaxQuantizer(axis=-1)
    classes = {
        "int4": quantizers.Int4QuantizationConfig,
        "int8": quantizers.Int8QuantizationConfig,
    }
    model = trained_copy("llama")
    model.backbone.quantize(mode, config=classes[mode](**config))
    with pytest.raises(UnsupportedModelError, match=problem):
        _export(model, tmp_path / mode)


# GPTQ's calibration of the Llama costs ~2.5 minutes of CI; GPT-2's GPTQ
# artifact is served token for token in the CI tier
# (test_quantized_serving.py), this round trip is in `-m matrix`.
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(mode, marks=pytest.mark.matrix if mode == "gptq" else ())
        for mode in quantized_models.MODES
    ],
)
def test_round_trip_is_bit_exact(mode, tmp_path):
    model = quantized_models.quantized("llama", mode)
    path = _export(model, tmp_path / mode)
    layers = _manifest(path)["quantization"]["layers"]
    assert layers and all(mode in name for name in layers.values())
    loaded = keras_vllm.load_causal_lm(path)
    want = weight_io.ordered_variables(model.backbone)
    got = weight_io.ordered_variables(loaded.backbone)
    assert [v.path for v in got] == [v.path for v in want]
    for a, b in zip(got, want):
        assert a.dtype == b.dtype, a.path
        assert np.array_equal(np.asarray(a.value), np.asarray(b.value)), a.path
    # The rebuilt layers compute what the exported ones did (Keras rebuilds
    # an int4 output head that quantizes its inputs, unless told otherwise).
    x, _, _ = testing.tokenize_corpus(model.preprocessor.tokenizer)
    x = {key: value[:4] for key, value in x.items()}
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
    for prompt in PROMPTS:
        assert loaded.generate(prompt, max_length=20) == model.generate(
            prompt, max_length=20
        )


def test_delta_against_the_float_preset_stores_the_quantized_layers(
    tmp_path, int8_artifact
):
    model = trained_copy("llama")
    preset = str(tmp_path / "preset")
    testing.save_tiny_preset(model, preset)
    model.backbone.quantize("int8")
    path = _export(model, tmp_path / "delta", preset=preset)
    manifest = _manifest(path)
    assert manifest["weights"]["mode"] == "delta"
    stored = set(manifest["weights"]["variables"])
    owners = {p.rsplit("/", 1)[0] for p in stored}
    # Exactly the quantized layers: the norms are the preset's.
    assert owners == set(manifest["quantization"]["layers"])
    full = _manifest(int8_artifact)["weights"]
    assert len(stored) < full["total_variables"]
    loaded = keras_vllm.load_causal_lm(path)
    # The rebuilt layers compute what the exported ones did (Keras rebuilds
    # an int4 output head that quantizes its inputs, unless told otherwise).
    x, _, _ = testing.tokenize_corpus(model.preprocessor.tokenizer)
    x = {key: value[:4] for key, value in x.items()}
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
    for prompt in PROMPTS:
        assert loaded.generate(prompt, max_length=20) == model.generate(
            prompt, max_length=20
        )


def test_quantized_lora_model_is_refused(tmp_path):
    model = trained_copy("llama")
    model.backbone.quantize("int8")
    model.backbone.enable_lora(2)
    with pytest.raises(UnsupportedModelError, match="LoRA enabled"):
        _export(model, tmp_path / "lora")
    assert not os.path.exists(tmp_path / "lora")


def test_inspect_shows_the_mode_and_stored_bytes(int8_artifact):
    manifest = _manifest(int8_artifact)
    count = len(manifest["quantization"]["layers"])
    summary = inspect_artifact.summary(fmt.open_artifact(int8_artifact))
    assert f"int8: {count} layers" in summary
    table = inspect_artifact.tensor_parallel_lines(
        fmt.open_artifact(int8_artifact)
    )
    tp1 = next(line for line in table[1:] if line.split()[0] == "1")
    # The TP=1 row counts each variable in its stored dtype (int8 kernels).
    assert inspect_artifact._size(manifest["weights"]["bytes"]) in tp1


def _layer(manifest, part):
    return next(p for p in manifest["quantization"]["layers"] if part in p)


def _set_mode(name):
    def edit(manifest):
        layer = _layer(manifest, "query")
        manifest["quantization"]["layers"][layer] = name

    return edit


def _unlisted_layer(manifest):
    del manifest["quantization"]["layers"][_layer(manifest, "query")]


def _foreign_layer(manifest):
    manifest["quantization"]["layers"]["transformer_layer_9/query"] = (
        "int8_from_float32"
    )


def _float_variable_as_int8(manifest):
    path = next(p for p in manifest["weights"]["variables"] if "layernorm" in p)
    manifest["weights"]["variables"][path]["dtype"] = "int8"


def _scale_shape(manifest):
    variables = manifest["weights"]["variables"]
    path = next(
        p
        for p, spec in variables.items()
        if p.endswith("kernel_scale") and spec["shape"] != spec["shape"][::-1]
    )
    # Same number of values (the parameter count still agrees), other shape.
    manifest["weights"]["variables"][path]["shape"].reverse()


def _scale_dtype(manifest):
    path = next(
        p for p in manifest["weights"]["variables"] if p.endswith("kernel_scale")
    )
    manifest["weights"]["variables"][path]["dtype"] = "int8"


def _section_shape(manifest):
    manifest["quantization"] = {"layers": [], "policy": "anything"}


HOSTILE = {
    "unknown_mode": (_set_mode("int3_from_float32"), "policy name"),
    "path_in_mode": (_set_mode("gptq/../../x_from_float32"), "policy name"),
    "other_source_dtype": (_set_mode("int8_from_bfloat16"), "computes in"),
    "class_name_as_mode": (_set_mode({"class_name": "Lambda"}), "policy name"),
    "layer_left_unlisted": (_unlisted_layer, "not listed"),
    "foreign_layer": (_foreign_layer, "stores no variable"),
    "float_variable_as_int8": (_float_variable_as_int8, "declares no|not listed"),
    # Scale shapes follow each layer's Keras layout: checked against the
    # rebuilt layer, before any weight is read.
    "scale_shape": (_scale_shape, "has shape"),
    "scale_dtype": (_scale_dtype, "float dtype"),
    "section_shape": (_section_shape, "'quantization'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_quantization_fields_are_refused_early(
    case, int8_artifact, tmp_path, monkeypatch
):
    edit, message = HOSTILE[case]
    path = str(tmp_path / case)
    shutil.copytree(int8_artifact, path)
    manifest = _manifest(path)
    edit(manifest)
    with open(os.path.join(path, fmt.MANIFEST_FILE), "w") as f:
        json.dump(manifest, f)

    def reached(*args, **kwargs):
        raise AssertionError(f"a hostile artifact reached {stage}")

    stage = "restore_weights" if case == "scale_shape" else "construct"
    owner = checkpoint if case == "scale_shape" else rebuild
    monkeypatch.setattr(owner, stage, reached)
    with pytest.raises(ArtifactError, match=message):
        keras_vllm.load_causal_lm(path)


def test_quantized_paths_do_not_depend_on_what_the_process_built(tmp_path):
    # Mixtral's MoE block is built without a name: Keras numbers it by how
    # many the process built before. Two exports of one int8 model from two
    # process histories record the same quantized paths (they recorded the
    # numbers, so a live update from a retrained model was refused as "its
    # weights are quantized (int8...), the served ones quantized (int8...)"),
    # and each loads in a process that numbers the block otherwise.
    # ~40 s here (2 tiny builds, 2 exports without golden outputs, 2 loads).
    first = testing.build_tiny_causal_lm("mixtral")
    first.backbone.quantize("int8")
    second = testing.build_tiny_causal_lm("mixtral")  # other numbers
    second.backbone.quantize("int8")
    live = [set(weight_io.quantized_layers(m.backbone)) for m in (first, second)]
    assert live[0] != live[1]
    a = first.export_vllm(str(tmp_path / "a"), golden_prompts=())
    b = second.export_vllm(str(tmp_path / "b"), golden_prompts=())
    recorded = _manifest(b)["quantization"]["layers"]
    assert _manifest(a)["quantization"]["layers"] == recorded
    assert any(p.endswith("mixtral_sparse_moe_block/sparse_feedforward_gate_dense")
               for p in recorded)
    update_checks.check_compatible(_manifest(a), _manifest(b), "b")

    x, _, _ = testing.tokenize_corpus(second.preprocessor.tokenizer)
    x = {key: value[:2] for key, value in x.items()}
    loaded = keras_vllm.load_causal_lm(b)
    rebuilt = set(weight_io.quantized_layers(loaded.backbone))
    assert len(rebuilt) == len(recorded) and rebuilt != live[1]
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(second(x)))

    # An artifact written before recorded the exporting process's numbers:
    # still read, and still an update of the new one.
    old = _manifest(a)
    old["quantization"]["layers"] = {
        path: recorded[weight_io.structural_paths(first.backbone)[path]]
        for path in live[0]
    }
    with open(os.path.join(a, fmt.MANIFEST_FILE), "w") as f:
        json.dump(old, f)
    update_checks.check_compatible(old, _manifest(b), "b")
    loaded = keras_vllm.load_causal_lm(a)
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(first(x)))
