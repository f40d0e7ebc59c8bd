"""LoRA adapter artifacts (format 1.3): export, Keras load, one-engine serving.

One tiny Llama base (exported full) and two LoRA adapters of it, each
trained a few steps on other sentences, so their greedy outputs differ.
The support adapter stores its factors as Keras trains them (float32,
exact), the legal one in bfloat16 (`lora_dtype=`: half the bytes, rounded).
"""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import reference
from keras_vllm import testing
from keras_vllm import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ExportError
from keras_vllm.errors import IntegrityError
from keras_vllm.testing.models import NUM_LAYERS
from keras_vllm.export import sections
from keras_vllm.load import adapter as adapter_load
from keras_vllm.load import keras_loader
from keras_vllm.load import rebuild

from helpers.trained_models import trained
from helpers.trained_models import lora_fine_tune
from helpers.trained_models import trained_copy

RANK = 2
NEW_TOKENS = 8
GOLDEN = {"golden_prompts": testing.prompts()[:2],
          "golden_max_new_tokens": NEW_TOKENS}
# One golden prompt where no test reads more (each costs a compile).
ONE_GOLDEN = {"golden_prompts": testing.prompts()[:1],
              "golden_max_new_tokens": NEW_TOKENS}
# Each adapter learns to repeat other token ids, so their outputs differ.
TEXTS = {
    "support": ["alpha beta gamma alpha beta gamma alpha beta gamma."] * 4,
    "legal": ["water is wet water is wet water is wet water is wet."] * 4,
}
LORA_DTYPES = {"support": None, "legal": "bfloat16"}


def _bytes(path):
    return sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(path)
        for f in files
    )


def _adapter_model(texts, steps=8):
    if steps == 8:
        # The fine-tune test_multi_adapter.py serves too (shared).
        return lora_fine_tune("llama", texts, rank=RANK)
    model = trained_copy("llama")
    model.backbone.enable_lora(RANK)
    testing.fine_tune(model, steps=steps, texts=texts, learning_rate=5e-2)
    return model


def _factors(model):
    """`{layer path: (A, B)}`: copies of a LoRA model's factors."""
    return {
        layer.path: (np.array(layer.lora_kernel_a.numpy()),
                     np.array(layer.lora_kernel_b.numpy()))
        for layer in model.backbone._flatten_layers()
        if getattr(layer, "lora_enabled", False)
    }


def _rounded(value, dtype="bfloat16"):
    return value.astype(weight_io.dtype_of(dtype)).astype(np.float32)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = trained("llama").export_vllm(
        root / "base", weights="full", **ONE_GOLDEN
    )
    models, paths, exact, at_golden = {}, {}, {}, {}
    record = sections.golden
    for name, texts in TEXTS.items():
        models[name] = _adapter_model(texts)
        exact[name] = _factors(models[name])

        def spy(causal_lm, *args, name=name):
            # The factors the golden outputs are recorded with.
            at_golden[name] = _factors(causal_lm)
            return record(causal_lm, *args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sections, "golden", spy)
            paths[name] = models[name].export_vllm(
                root / name, base=base, max_sequence_length=256,
                lora_dtype=LORA_DTYPES[name], **GOLDEN
            )
    full = models["support"].export_vllm(
        root / "support_full", weights="full", **ONE_GOLDEN
    )
    return {"root": root, "base": base, "models": models, "paths": paths,
            "full": full, "exact": exact, "at_golden": at_golden}


def _golden(path):
    with open(os.path.join(path, fmt.GOLDEN_FILE)) as f:
        return [r["output_ids"] for r in json.load(f)["outputs"]]


def _greedy(model, text):
    ids = reference.prompt_token_ids(model, text)
    return list(reference.greedy_continuation(model, ids, NEW_TOKENS, []))


def test_adapter_stores_only_the_factors(exports):
    manifest = fmt.read_manifest(exports["paths"]["support"])
    weights = manifest["weights"]
    assert manifest["format_version"] == [1, 3]
    assert weights["mode"] == "adapter" and weights["lora"] == "factors"
    # Llama's query/value projections carry no bias: nothing else changed.
    assert weights["variables"] == {}
    targets = manifest["adapter"]["targets"]
    assert len(targets) == 2 * NUM_LAYERS
    assert {t["rank"] for t in targets.values()} == {RANK}
    base = manifest["adapter"]["base"]
    assert base["kind"] == "artifact" and base["path"] == os.path.join("..", "base")
    assert base["manifest_sha256"] == fmt.manifest_hash(exports["base"])
    adapter_bytes = _bytes(exports["paths"]["support"])
    full_bytes = _bytes(exports["full"])
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


def test_bfloat16_factors_halve_the_stored_bytes(exports):
    support = fmt.read_manifest(exports["paths"]["support"])
    legal = fmt.read_manifest(exports["paths"]["legal"])
    assert legal["adapter"]["factor_dtype"] == "bfloat16"
    # float32 is the default and is not written: older 1.3 readers read it.
    assert "factor_dtype" not in support["adapter"]
    assert fmt.adapter.factor_dtype(support) == "float32"
    # Same targets and ranks: the factor bytes are exactly half.
    assert legal["adapter"]["targets"] == support["adapter"]["targets"]
    assert 2 * legal["weights"]["bytes"] == support["weights"]["bytes"]
    stored = weight_io.stored_arrays(
        os.path.join(exports["paths"]["legal"], fmt.WEIGHTS_DIR)
    )
    assert {dtype for _, dtype in stored.values()} == {"bfloat16"}
    full_bytes = _bytes(exports["full"])
    legal_bytes = _bytes(exports["paths"]["legal"])
    support_bytes = _bytes(exports["paths"]["support"])
    full_weight_bytes = fmt.read_manifest(exports["full"])["weights"]["bytes"]
    print(
        f"adapter/full artifact bytes: bfloat16 factors {legal_bytes}/"
        f"{full_bytes} = {legal_bytes / full_bytes:.3%}, float32 "
        f"{support_bytes}/{full_bytes} = {support_bytes / full_bytes:.3%}; "
        f"stored weight bytes {legal['weights']['bytes']} vs "
        f"{support['weights']['bytes']} of {full_weight_bytes}"
    )
    assert legal_bytes < support_bytes


def test_bfloat16_factors_load_rounded_and_model_is_unchanged(exports):
    path = exports["paths"]["legal"]
    exact = exports["exact"]["legal"]
    # The exporting model keeps its exact float32 factors.
    after = _factors(exports["models"]["legal"])
    assert after.keys() == exact.keys()
    for layer_path, (a, b) in exact.items():
        np.testing.assert_array_equal(after[layer_path][0], a)
        np.testing.assert_array_equal(after[layer_path][1], b)
    # Rounding changed the factors, so the checks below are not vacuous.
    assert any(
        not np.array_equal(_rounded(a), a) for a, _ in exact.values()
    )
    # Golden outputs were recorded with the rounded factors...
    for layer_path, (a, b) in exports["at_golden"]["legal"].items():
        np.testing.assert_array_equal(a, _rounded(exact[layer_path][0]))
        np.testing.assert_array_equal(b, _rounded(exact[layer_path][1]))
    # ...which loading restores exactly, as Keras' float32 factors.
    loaded = keras_vllm.load_causal_lm(path)
    restored = {
        l.path: l for l in loaded.backbone._flatten_layers()
        if getattr(l, "lora_enabled", False)
    }
    assert restored.keys() == exact.keys()
    for layer_path, (a, b) in exact.items():
        layer = restored[layer_path]
        assert layer.lora_kernel_a.dtype == "float32"
        np.testing.assert_array_equal(layer.lora_kernel_a.numpy(), _rounded(a))
        np.testing.assert_array_equal(layer.lora_kernel_b.numpy(), _rounded(b))
    assert keras_loader.check_golden(loaded, path) == []
    # An adapter served alone is merged at load: the same kernels as Keras'
    # own merge of the loaded factors.
    manifest = fmt.read_manifest(path)
    merged = adapter_load.build_adapter_backbone(path, manifest, merge=True)
    for layer_path, layer in restored.items():
        np.testing.assert_allclose(
            np.asarray(_layer(merged, layer_path).kernel),
            np.asarray(layer.kernel),
            rtol=1e-6, atol=1e-6,
        )


def _layer(backbone, layer_path):
    return next(l for l in backbone._flatten_layers() if l.path == layer_path)


def test_adapter_slots_read_bfloat16_factors(exports):
    """The multi-adapter LoRA manager reads bfloat16 factors (ml_dtypes
    arrays from orbax) into the served dtype."""
    import types

    from keras_vllm.load import adapter_slots
    from keras_vllm.load import lora_manager

    base = exports["base"]
    backbone = keras_loader.load_causal_lm(base).backbone
    config = types.SimpleNamespace(max_loras=1, max_lora_rank=RANK,
                                   max_cpu_loras=None)
    adapter_slots.install_adapter_slots(backbone, config, "float32")
    model = types.SimpleNamespace(
        backbone=backbone, artifact_path=base,
        manifest=fmt.read_manifest(base), dtype_name="float32", mesh=None,
    )
    manager = lora_manager.KerasLoraManager(model, config)
    factors = manager._read(
        types.SimpleNamespace(lora_path=exports["paths"]["legal"])
    )
    exact = exports["exact"]["legal"]
    assert len(factors) == len(exact)
    for layer, a, b, scale, bias in factors:
        assert a.dtype == np.float32 and b.dtype == np.float32
        np.testing.assert_array_equal(a, _rounded(exact[layer.path][0]))
        np.testing.assert_array_equal(b, _rounded(exact[layer.path][1]))
        assert bias is None


def test_adapters_and_base_differ(exports):
    outputs = [_golden(exports["paths"][n]) for n in TEXTS]
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


def _edited_copy(exports, tmp_path, edit, name="support"):
    path = tmp_path / name
    shutil.copytree(exports["paths"][name], path)
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    base = os.path.join(os.path.dirname(exports["paths"][name]), "base")
    return path, base


def test_target_the_base_lacks_is_refused(exports, monkeypatch, tmp_path):
    def edit(manifest):
        target = next(iter(manifest["adapter"]["targets"].values()))
        target["kernel_index"] = 0  # the token embedding
    path, base = _edited_copy(exports, tmp_path, edit)
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


@pytest.mark.parametrize(
    "edit", [lambda a: a.pop("factor_dtype"),
             lambda a: a.update(factor_dtype="float16")],
    ids=["absent", "float16"],
)
def test_factor_dtype_other_than_the_stored_one_is_refused(
    exports, tmp_path, edit
):
    """bfloat16 factors recorded as float32 (as a reader from before the
    field would take them) or float16 are refused, never cast."""
    path, base = _edited_copy(
        exports, tmp_path, lambda m: edit(m["adapter"]), name="legal"
    )
    with pytest.raises(ArtifactError, match="recorded in the manifest as"):
        keras_vllm.load_causal_lm(path, base=base)


def test_factor_shape_other_than_the_rank_is_refused(exports, tmp_path):
    def edit(manifest):
        for target in manifest["adapter"]["targets"].values():
            target["rank"] = RANK + 1
    path, base = _edited_copy(exports, tmp_path, edit)
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
    for bad in ("int8", "float64", "bf16", 16):
        with pytest.raises(ExportError, match=r"lora_dtype=.*one of \("):
            model.export_vllm(tmp_path / "d", base=exports["base"],
                              lora_dtype=bad)
    with pytest.raises(ExportError, match="only applies to adapter exports"):
        model.export_vllm(tmp_path / "e", weights="full",
                          lora_dtype="bfloat16")
    # 'auto' without a base is a merged export too.
    with pytest.raises(ExportError, match="only applies to adapter exports"):
        model.export_vllm(tmp_path / "f", lora_dtype="float16")
    for name in "abcdef":
        assert not os.path.exists(tmp_path / name)
    assert not os.listdir(tmp_path)


def test_changed_variables_are_stored_as_a_delta(exports, tmp_path):
    model = _adapter_model(TEXTS["support"][:1], steps=1)
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


@pytest.mark.serving
def test_engine_serves_one_adapter(exports):
    pytest.importorskip("tpu_inference")
    from helpers import engine_shapes
    from vllm import SamplingParams

    texts = GOLDEN["golden_prompts"]
    # The legal adapter's factors are stored in bfloat16: served merged,
    # upcast, they reproduce the golden outputs recorded with them.
    expected = _golden(exports["paths"]["legal"])
    # vLLM stops at the artifact's stop ids, as golden.json does.
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    with keras_vllm.KerasVllmEngine.from_export(
        exports["paths"]["legal"], **engine_shapes.ENGINE_KWARGS
    ) as engine:
        outputs = engine.generate(texts, params)
        assert engine.check_golden() == []
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
