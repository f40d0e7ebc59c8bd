"""Per-layer KV cache specs (format 1.7): what `config.json` tells vLLM
when attention layers differ in head size, KV heads or window, or share
another layer's cache, and what readers accept.

Serving exactness of such a model is checked by the Gemma 4 fixture in
`tests/serve/test_serving_families.py`; these tests need no engine.
"""

import pytest

from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.export.kv_layout import kv_layout
from keras_vllm.export.kv_layout import layout_fields
from keras_vllm.format import vllm_files
from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import cache_of_layer
from keras_vllm.layers.common.context import ServingContext
from keras_vllm.serve.worker import capacity

LOCAL = KVCacheSpec(4, 2, 16, sliding_window=16)
GLOBAL = KVCacheSpec(4, 1, 32)


def _shared(spec):
    return KVCacheSpec(
        spec.num_query_heads, spec.num_kv_heads, spec.head_dim,
        spec.sliding_window, shares_cache=True,
    )


def test_mixed_head_sizes_become_per_kind_fields():
    fields = layout_fields([LOCAL] * 5 + [GLOBAL])
    assert fields == {
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 16,
    }
    assert capacity.cache_shapes(fields) == [(2, 16)] * 5 + [(1, 32)]


def test_uniform_models_keep_their_fields():
    fields = layout_fields([KVCacheSpec(4, 2, 16)] * 2)
    assert fields == {
        "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16,
    }


def test_shared_layers_read_the_last_cache_of_their_kind():
    specs = [LOCAL, GLOBAL, LOCAL, GLOBAL, _shared(LOCAL), _shared(GLOBAL)]
    fields = layout_fields(specs)
    assert fields["num_kv_shared_layers"] == 2
    # Four caches: the shared layers read those of layers 2 and 3.
    assert cache_of_layer(specs) == [0, 1, 2, 3, 2, 3]
    assert len(capacity.cache_shapes(fields)) == 4


@pytest.mark.parametrize(
    "specs, message",
    [
        ([_shared(LOCAL), LOCAL], "not the last layers"),
        ([LOCAL, _shared(GLOBAL)], "no earlier full-attention layer"),
        (
            [LOCAL, GLOBAL, KVCacheSpec(4, 2, 32, sliding_window=16)],
            "of one kind .* different head",
        ),
        ([KVCacheSpec(4, 2, 16), KVCacheSpec(4, 1, 32)], "of one kind"),
        ([LOCAL, KVCacheSpec(8, 1, 32)], "equal query heads"),
        ([GLOBAL, _shared(GLOBAL)], "without sliding-window"),
    ],
)
def test_layouts_vllm_cannot_size_are_refused(specs, message):
    with pytest.raises(UnsupportedModelError, match=message):
        layout_fields(specs)


def test_the_gemma4_fixture_declares_its_global_layer():
    backbone = testing.backbone_class("gemma4")(
        vocabulary_size=256, **testing.backbone_config("gemma4", num_layers=6)
    )
    fields = kv_layout(backbone)
    assert fields["layer_types"][-1] == "full_attention"
    assert (fields["global_head_dim"], fields["num_global_key_value_heads"]) == (
        32, 1,
    )


def test_kv_sharing_fixture_allocates_no_cache_for_shared_layers():
    backbone = testing.backbone_class("gemma4")(
        vocabulary_size=256,
        **testing.backbone_config(
            "gemma4", num_layers=6, num_kv_shared_layers=2,
            layer_types=["sliding_attention", "full_attention"] * 3,
        ),
    )
    fields = kv_layout(backbone)
    assert fields["num_kv_shared_layers"] == 2
    assert len(capacity.cache_shapes(fields)) == 4


def _manifest(version):
    return {
        "format_version": list(version),
        "backbone": {"config": {}},
        "max_sequence_length": 64,
        "dtype": "float32",
        "stop_token_ids": [1],
        "tokenizer": {},
    }


def _config(**fields):
    config = {
        "architectures": [fmt.ARCHITECTURE], "model_type": fmt.MODEL_TYPE,
        "hidden_size": 64, "vocab_size": 256, "max_position_embeddings": 64,
        "torch_dtype": "float32", "eos_token_id": [1],
    }
    config.update(layout_fields([LOCAL] * 5 + [GLOBAL]))
    config.update(fields)
    return config


def test_reader_accepts_per_kind_fields_in_1_7():
    vllm_files.check_vllm_config(_config(), _manifest((1, 7)), 256)


@pytest.mark.parametrize(
    "fields, version, message",
    [
        ({}, (1, 6), "format versions before 1.7"),
        ({"attention_k_eq_v": False}, (1, 7), "come together"),
        ({"num_global_key_value_heads": 3}, (1, 7), "not a multiple"),
        ({"num_kv_shared_layers": 6}, (1, 7), "num_kv_shared_layers"),
    ],
)
def test_reader_refuses_altered_per_kind_fields(fields, version, message):
    with pytest.raises(ArtifactError, match=message):
        vllm_files.check_vllm_config(_config(**fields), _manifest(version), 256)


def test_context_routes_shared_layers_and_counts_writes():
    context = ServingContext(["a", "b"], None, None, cache_of_layer=[0, 1, 1])
    context.write_cache(0, "a2")
    context.write_cache(1, "b2")
    assert context.read_cache(2) == "b2"
    # The sharing layer's kernel returns the cache it read (aliased,
    # unchanged); the step hands that on, so XLA updates in place instead
    # of copying the cache first (an out-of-memory error on a TPU).
    context.mark_read(2, passed_on="b2 via layer 2")
    assert context.kv_caches == ["a2", "b2 via layer 2"]
    context.check_all_used_once()
    twice = ServingContext(["a"], None, None, cache_of_layer=[0, 0])
    twice.write_cache(0, "x")
    twice.write_cache(1, "y")
    with pytest.raises(RuntimeError, match="written exactly once"):
        twice.check_all_used_once()


def test_kv_bytes_per_kind_count_shared_caches_once():
    """`keras-vllm inspect`'s KV table: per kind, the layers, the caches
    they allocate and the bytes per token of those caches (float32, head
    sizes laid out 128 wide), beside what one cache per layer would take."""
    specs = [LOCAL, GLOBAL, LOCAL, GLOBAL, _shared(LOCAL), _shared(GLOBAL)]
    rows = capacity.kv_by_kind(layout_fields(specs), "float32")
    local, full = 2 * 2 * 128 * 4, 2 * 1 * 128 * 4  # keys and values
    assert [(r["kind"], r["layers"], r["caches"], r["kv_heads"],
             r["head_dim"], r["laid_out"], r["bytes"], r["unshared_bytes"])
            for r in rows] == [
        ("sliding_attention", 3, 2, 2, 16, 128, 2 * local, 3 * local),
        ("full_attention", 3, 2, 1, 32, 128, 2 * full, 3 * full),
    ]
    uniform = capacity.kv_by_kind(
        layout_fields([KVCacheSpec(4, 2, 64)] * 2), "bfloat16"
    )
    assert [(r["kind"], r["caches"], r["laid_out"], r["bytes"])
            for r in uniform] == [("full_attention", 2, 64, 2 * 2 * 2 * 64 * 2)]
