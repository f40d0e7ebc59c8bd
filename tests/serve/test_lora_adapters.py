"""LoRA adapter artifacts (format 1.3): export, Keras load, one-engine serving.

One tiny Llama base (exported full) and two LoRA adapters of it, each
trained a few steps on other sentences, so their greedy outputs differ
(`helpers.lora_exports`; the legal adapter stores bfloat16 factors, whose
own checks are in test_lora_factor_dtype.py).
"""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm.hub import reference
from keras_vllm import testing
from keras_vllm.bench.prepare import dir_bytes
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ExportError
from keras_vllm.errors import IntegrityError
from keras_vllm.testing.models import NUM_LAYERS
from keras_vllm.load import keras_loader
from keras_vllm.load import rebuild

from helpers import lora_exports
from helpers.lora_exports import GOLDEN
from helpers.lora_exports import NEW_TOKENS
from helpers.lora_exports import RANK
from helpers.lora_exports import TEXTS
from helpers.trained_models import trained_copy


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return lora_exports.exports(tmp_path_factory)



def _greedy(model, text):
    ids = reference.prompt_token_ids(model, text)
    return list(reference.greedy_continuation(model, ids, NEW_TOKENS, []))


def test_adapter_stores_only_the_factors(exports):
    manifest = fmt.read_manifest(exports["paths"]["support"])
    weights = manifest["weights"]
    assert manifest["format_version"] == list(fmt.FORMAT_VERSION)
    assert weights["mode"] == "adapter" and weights["lora"] == "factors"
    # Llama's query/value projections carry no bias: nothing else changed.
    assert weights["variables"] == {}
    targets = manifest["adapter"]["targets"]
    assert len(targets) == 2 * NUM_LAYERS
    assert {t["rank"] for t in targets.values()} == {RANK}
    base = manifest["adapter"]["base"]
    assert base["kind"] == "artifact" and base["path"] == os.path.join("..", "base")
    assert base["manifest_sha256"] == fmt.manifest_hash(exports["base"])
    adapter_bytes = dir_bytes(exports["paths"]["support"])
    full_bytes = dir_bytes(exports["full"])
    factor_bytes = weights["bytes"]
    full_weight_bytes = fmt.read_manifest(exports["full"])["weights"]["bytes"]
    print(
        f"adapter/full artifact bytes: {adapter_bytes}/{full_bytes} = "
        f"{adapter_bytes / full_bytes:.3%}; stored weight bytes "
        f"{factor_bytes}/{full_weight_bytes} = "
        f"{factor_bytes / full_weight_bytes:.3%}"
    )
    assert factor_bytes < 0.1 * full_weight_bytes
    assert adapter_bytes < 0.1 * full_bytes


def test_load_returns_base_with_lora_factors(exports):
    model = exports["models"]["support"]
    loaded = keras_vllm.load_causal_lm(exports["paths"]["support"])
    lora = [l for l in loaded.backbone._flatten_layers() if getattr(
        l, "lora_enabled", False)]
    assert len(lora) == 2 * NUM_LAYERS
    originals = {l.path: l for l in model.backbone._flatten_layers()
                 if getattr(l, "lora_enabled", False)}
    for layer in lora:
        np.testing.assert_array_equal(
            layer.lora_kernel_a.numpy(), originals[layer.path].lora_kernel_a.numpy()
        )
        # Not merged: the plain kernel is the base's.
        assert not layer._kernel.trainable and layer.lora_kernel_a.trainable
    # golden.json holds the exported model's own generate() outputs.
    assert keras_loader.check_golden(loaded, exports["paths"]["support"]) == []


def test_adapters_and_base_differ(exports):
    outputs = [lora_exports.golden(exports["paths"][n]) for n in TEXTS]
    assert outputs[0] != outputs[1]
    # Each fine-tune moved the model where it was trained: on the start of
    # its own text its continuation is not the base's. (On the shared golden
    # prompt a tiny model trained a few steps may still agree with the
    # base, depending on the fixtures trained before it.)
    base_model = keras_loader.load_causal_lm(exports["base"])
    for name, texts in TEXTS.items():
        start = " ".join(texts[0].split()[:2])
        assert _greedy(exports["models"][name], start) != _greedy(
            base_model, start
        ), name


def test_wrong_base_is_refused_before_building(exports, monkeypatch, tmp_path):
    def no_build(*args, **kwargs):
        raise AssertionError("built a backbone before refusing")

    monkeypatch.setattr(rebuild, "construct", no_build)
    with pytest.raises(IntegrityError, match="not the artifact the adapter"):
        keras_vllm.load_causal_lm(
            exports["paths"]["support"], base=exports["full"]
        )
    # The recorded path holding another artifact is refused too.
    moved = tmp_path / "pair"
    moved.mkdir()
    shutil.copytree(exports["paths"]["support"], moved / "support")
    shutil.copytree(exports["full"], moved / "base")
    with pytest.raises(IntegrityError, match="manifest_sha256"):
        keras_vllm.load_causal_lm(moved / "support")
    shutil.rmtree(moved / "base")
    with pytest.raises(ArtifactError, match="does not exist"):
        keras_vllm.load_causal_lm(moved / "support")


def test_target_the_base_lacks_is_refused(exports, monkeypatch, tmp_path):
    def edit(manifest):
        target = next(iter(manifest["adapter"]["targets"].values()))
        target["kernel_index"] = 0  # the token embedding
    path, base = lora_exports.edited_copy(exports, tmp_path, edit)
    monkeypatch.setattr(
        rebuild, "construct",
        lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")),
    )
    with pytest.raises(ArtifactError, match="the base lacks that kernel"):
        keras_vllm.load_causal_lm(path, base=base)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.update(rank=0), "rank"),
        (lambda t: t.update(rank=True), "rank"),
        (lambda t: t.update(alpha=float("inf")), "alpha"),
        (lambda t: t.update(kernel="../../etc/kernel"), "kernel"),
        (lambda t: t.update(kernel_shape=[64]), "kernel_shape"),
        (lambda t: t.update(extra=1), "exactly"),
    ],
)
def test_hostile_target_fields_are_refused(exports, edit, message):
    manifest = fmt.read_manifest(exports["paths"]["support"])
    manifest = json.loads(json.dumps(manifest))
    edit(next(iter(manifest["adapter"]["targets"].values())))
    with pytest.raises(ArtifactError, match=message):
        fmt.validate_manifest(manifest)


def test_hostile_adapter_sections_are_refused(exports):
    manifest = fmt.read_manifest(exports["paths"]["support"])
    for edit, message in [
        (lambda m: m.pop("adapter"), "exactly when"),
        (lambda m: m["weights"].update(lora="merged"), "exactly when"),
        (lambda m: m["adapter"]["base"].update(kind="url"), "kind"),
        (lambda m: m["adapter"]["base"].update(manifest_sha256="x"), "SHA-256"),
        (lambda m: m["adapter"].update(targets={}), "targets"),
        (lambda m: m["adapter"].update(factor_dtype="int8"), "factor_dtype"),
        (lambda m: m["adapter"].update(factor_dtype="float64"),
         "factor_dtype"),
        (lambda m: m["adapter"].update(factor_dtype={"a": 1}),
         "factor_dtype"),
        (lambda m: m["adapter"].update(factor_dtype=["bfloat16"]),
         "factor_dtype"),
        (lambda m: m["adapter"].update(factor_dtype=None), "factor_dtype"),
        (lambda m: m["adapter"].update(factor_scale=1), "optionally"),
    ]:
        copy = json.loads(json.dumps(manifest))
        edit(copy)
        with pytest.raises(ArtifactError, match=message):
            fmt.validate_manifest(copy)


def test_factor_shape_other_than_the_rank_is_refused(exports, tmp_path):
    def edit(manifest):
        for target in manifest["adapter"]["targets"].values():
            target["rank"] = RANK + 1
    path, base = lora_exports.edited_copy(exports, tmp_path, edit)
    with pytest.raises(ArtifactError, match="recorded in the manifest as"):
        keras_vllm.load_causal_lm(path, base=base)


def test_format_1_2_reader_refuses_adapters(exports, monkeypatch):
    """A 1.2 reader knows neither the mode nor the field: it refuses the
    artifact on `weights.mode` instead of loading the base alone."""
    from keras_vllm.format import manifest as manifest_lib

    manifest = fmt.read_manifest(exports["paths"]["support"])
    monkeypatch.setattr(manifest_lib, "FORMAT_VERSION", (1, 2))
    monkeypatch.setattr(manifest_lib, "WEIGHT_MODES", ("preset", "delta", "full"))
    with pytest.raises(ArtifactError, match="'weights.mode' is 'adapter'"):
        fmt.validate_manifest(manifest)


def test_export_refusals(exports, tmp_path):
    plain = trained_copy("llama")
    with pytest.raises(ExportError, match="LoRA enabled"):
        plain.export_vllm(tmp_path / "a", weights="adapter", base=exports["base"])
    model = exports["models"]["support"]
    with pytest.raises(ExportError, match="needs the base"):
        model.export_vllm(tmp_path / "b", weights="adapter")
    with pytest.raises(ExportError, match="not both"):
        model.export_vllm(tmp_path / "c", base=exports["base"], preset="x")
    assert not os.path.exists(tmp_path / "a")


def test_changed_variables_are_stored_as_a_delta(exports, tmp_path):
    model = lora_exports.adapter_model(TEXTS["support"][:1], steps=1)
    norm = model.backbone.get_layer("sequence_output_layernorm")
    norm.scale.assign(norm.scale.numpy() + 0.5)
    path = model.export_vllm(tmp_path / "delta", base=exports["base"],
                             golden_prompts=testing.prompts()[:1],
                             golden_max_new_tokens=4)
    manifest = fmt.read_manifest(path)
    assert list(manifest["weights"]["variables"]) == [norm.scale.path]
    loaded = keras_vllm.load_causal_lm(path)
    np.testing.assert_array_equal(
        loaded.backbone.get_layer("sequence_output_layernorm").scale.numpy(),
        norm.scale.numpy(),
    )
    assert keras_loader.check_golden(loaded, path) == []


def test_engine_serves_one_adapter(exports):
    pytest.importorskip("tpu_inference")
    from helpers import engine_shapes
    from vllm import SamplingParams

    texts = GOLDEN["golden_prompts"]
    # The legal adapter's factors are stored in bfloat16: served merged,
    # upcast, they reproduce the golden outputs recorded with them.
    expected = lora_exports.golden(exports["paths"]["legal"])
    # vLLM stops at the artifact's stop ids, as golden.json does.
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    with keras_vllm.KerasVllmEngine.from_export(
        exports["paths"]["legal"], **engine_shapes.ENGINE_KWARGS
    ) as engine:
        outputs = engine.generate(texts, params)
        assert engine.check_golden() == []
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
