"""LoRA factors stored in another dtype than Keras' float32 (`lora_dtype=`).

Uses the adapters of `helpers.lora_exports` (shared with
test_lora_adapters.py, which serves the bfloat16 one alone on an engine):
the legal adapter stores bfloat16 factors, the support adapter float32.
bfloat16 halves the factor bytes and rounds the factors; golden outputs
are recorded with the rounded factors, loading and the multi-adapter LoRA
manager restore exactly those, and the exporting model keeps its own.
"""

import os
import types

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm.bench.prepare import dir_bytes
from keras_vllm.hub import checkpoint
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ExportError
from keras_vllm.load import adapter as adapter_load
from keras_vllm.load import keras_loader

from helpers import lora_exports
from helpers.lora_exports import RANK
from helpers.lora_exports import factors
from helpers.lora_exports import rounded


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return lora_exports.exports(tmp_path_factory)


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
    stored = checkpoint.stored_arrays(
        os.path.join(exports["paths"]["legal"], fmt.WEIGHTS_DIR)
    )
    assert {dtype for _, dtype in stored.values()} == {"bfloat16"}
    full_bytes = dir_bytes(exports["full"])
    legal_bytes = dir_bytes(exports["paths"]["legal"])
    support_bytes = dir_bytes(exports["paths"]["support"])
    full_weight_bytes = fmt.read_manifest(exports["full"])["weights"]["bytes"]
    print(
        f"adapter/full artifact bytes: bfloat16 factors {legal_bytes}/"
        f"{full_bytes} = {legal_bytes / full_bytes:.3%}, float32 "
        f"{support_bytes}/{full_bytes} = {support_bytes / full_bytes:.3%}; "
        f"stored weight bytes {legal['weights']['bytes']} vs "
        f"{support['weights']['bytes']} of {full_weight_bytes}"
    )
    # On disk, both adapters are a few percent of the full artifact. They
    # are not compared with each other: at this size the 3.3 KB the
    # bfloat16 factors save is below the noise of orbax's OCDBT layout,
    # which splits small concurrent writes into a varying number of data
    # files (the same bfloat16 adapter took 27.2-31.9 KB across runs).
    assert legal_bytes < 0.1 * full_bytes
    assert support_bytes < 0.1 * full_bytes


def test_bfloat16_factors_load_rounded_and_model_is_unchanged(exports):
    path = exports["paths"]["legal"]
    exact = exports["exact"]["legal"]
    # The exporting model keeps its exact float32 factors.
    after = factors(exports["models"]["legal"])
    assert after.keys() == exact.keys()
    for layer_path, (a, b) in exact.items():
        np.testing.assert_array_equal(after[layer_path][0], a)
        np.testing.assert_array_equal(after[layer_path][1], b)
    # Rounding changed the factors, so the checks below are not vacuous.
    assert any(
        not np.array_equal(rounded(a), a) for a, _ in exact.values()
    )
    # Golden outputs were recorded with the rounded factors...
    for layer_path, (a, b) in exports["at_golden"]["legal"].items():
        np.testing.assert_array_equal(a, rounded(exact[layer_path][0]))
        np.testing.assert_array_equal(b, rounded(exact[layer_path][1]))
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
        np.testing.assert_array_equal(layer.lora_kernel_a.numpy(), rounded(a))
        np.testing.assert_array_equal(layer.lora_kernel_b.numpy(), rounded(b))
    assert keras_loader.check_golden(loaded, path) == []
    # An adapter served alone is merged at load: the same kernels as Keras'
    # own merge of the loaded factors.
    merged = adapter_load.build_adapter_backbone(
        fmt.open_artifact(path), merge=True
    )
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
    from keras_vllm.serve.worker import adapter_slots
    from keras_vllm.serve.worker import lora_manager

    base = exports["base"]
    backbone = keras_loader.load_causal_lm(base).backbone
    config = types.SimpleNamespace(max_loras=1, max_lora_rank=RANK,
                                   max_cpu_loras=None)
    adapter_slots.install_adapter_slots(backbone, config, "float32")
    model = types.SimpleNamespace(
        backbone=backbone, artifact=fmt.open_artifact(base),
        dtype_name="float32", mesh=None,
    )
    manager = lora_manager.KerasLoraManager(model, config)
    read = manager._read(
        types.SimpleNamespace(lora_path=exports["paths"]["legal"])
    )
    exact = exports["exact"]["legal"]
    assert len(read) == len(exact)
    for layer, a, b, scale, bias in read:
        assert a.dtype == np.float32 and b.dtype == np.float32
        np.testing.assert_array_equal(a, rounded(exact[layer.path][0]))
        np.testing.assert_array_equal(b, rounded(exact[layer.path][1]))
        assert bias is None




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
    path, base = lora_exports.edited_copy(
        exports, tmp_path, lambda m: edit(m["adapter"]), name="legal"
    )
    with pytest.raises(ArtifactError, match="recorded in the manifest as"):
        keras_vllm.load_causal_lm(path, base=base)


def test_bad_lora_dtype_is_refused_before_writing(exports, tmp_path):
    model = exports["models"]["support"]
    for bad in ("int8", "float64", "bf16", 16):
        with pytest.raises(ExportError, match=r"lora_dtype=.*one of \("):
            model.export_vllm(tmp_path / "a", base=exports["base"],
                              lora_dtype=bad)
    with pytest.raises(ExportError, match="only applies to adapter exports"):
        model.export_vllm(tmp_path / "b", weights="full",
                          lora_dtype="bfloat16")
    # 'auto' without a base is a merged export too.
    with pytest.raises(ExportError, match="only applies to adapter exports"):
        model.export_vllm(tmp_path / "c", lora_dtype="float16")
    assert not os.listdir(tmp_path)
