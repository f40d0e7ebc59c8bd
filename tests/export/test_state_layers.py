"""Recurrent-state layers (format 1.10): what `config.json` tells vLLM about
layers that keep a per-sequence state instead of a KV cache, what readers
accept, and the page and memory sizes the serving side derives from it.

Serving exactness (state slots in the engine, chunked prefill, more
sequences than slots) is checked by the Qwen 3.5 fixture in
`tests/serve/test_serving_more_families.py`; these tests need no engine.
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
from keras_vllm.layers.common.recurrent_state import StateSpec
from keras_vllm.serve.worker import capacity

ATTENTION = KVCacheSpec(4, 2, 16)
STATE = StateSpec(shapes=((3, 96), (4, 16, 16)), dtypes=("float32", "float32"))


def _qwen3_5_backbone():
    config = testing.backbone_config("qwen3_5")
    return testing.backbone_class("qwen3_5")(**config, vocabulary_size=64)


def test_qwen3_5_declares_its_linear_layers_state():
    """3 Gated DeltaNet layers then one full-attention layer: the first
    three are state layers, the conv window `[kernel - 1, 2 * key_dim +
    value_dim]` and the delta-rule state `[v_heads, d_k, d_v]`."""
    config = testing.backbone_config("qwen3_5")
    fields = kv_layout(_qwen3_5_backbone())
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = (
        config["linear_num_value_heads"] * config["linear_value_head_dim"]
    )
    assert fields == {
        "num_hidden_layers": 4,
        "num_attention_heads": config["num_query_heads"],
        "num_key_value_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "recurrent_state_layers": [0, 1, 2],
        "recurrent_state_shapes": [
            [3, 2 * key_dim + value_dim],
            [
                config["linear_num_value_heads"],
                config["linear_key_head_dim"],
                config["linear_value_head_dim"],
            ],
        ],
        "recurrent_state_dtypes": ["float32", "float32"],
    }
    # No KV cache for the state layers; each has its own slots.
    assert capacity.cache_shapes(fields) == [(2, config["head_dim"])]


def test_state_layers_get_their_own_cache_index():
    specs = [STATE, STATE, STATE, ATTENTION] * 2
    assert cache_of_layer(specs) == list(range(8))
    assert layout_fields(specs)["recurrent_state_layers"] == [0, 1, 2, 4, 5, 6]


def test_state_bytes_per_sequence():
    assert STATE.bytes_per_sequence() == (3 * 96 + 4 * 16 * 16) * 4


@pytest.mark.parametrize(
    "specs, message",
    [
        (
            [STATE, StateSpec(((3, 8),), ("float32",)), ATTENTION],
            "different shapes or dtypes",
        ),
        ([STATE, STATE], "every layer keeps a recurrent state"),
        (
            [STATE, KVCacheSpec(4, 2, 16, sliding_window=8), ATTENTION],
            "sliding-window or KV-sharing",
        ),
    ],
)
def test_layouts_vllm_cannot_hold_are_refused(specs, message):
    with pytest.raises(UnsupportedModelError, match=message):
        layout_fields(specs)


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
    config.update(layout_fields([STATE, STATE, STATE, ATTENTION]))
    config.update(fields)
    return config


def test_reader_accepts_state_fields_in_1_10():
    vllm_files.check_vllm_config(_config(), _manifest((1, 10)), 256)


@pytest.mark.parametrize(
    "fields, version, message",
    [
        ({}, (1, 9), "format versions before 1.10"),
        ({"recurrent_state_layers": [0, 4]}, (1, 10), "layer indices"),
        ({"recurrent_state_layers": [1, 0]}, (1, 10), "layer indices"),
        ({"recurrent_state_layers": [0, 1, 2, 3]}, (1, 10), "attention layer"),
        ({"recurrent_state_shapes": [[3, -1]]}, (1, 10), "malformed"),
        ({"recurrent_state_dtypes": ["int8", "float32"]}, (1, 10), "dtypes"),
    ],
)
def test_reader_refuses_bad_state_fields(fields, version, message):
    with pytest.raises(ArtifactError, match=message):
        vllm_files.check_vllm_config(_config(**fields), _manifest(version), 256)


def test_reader_refuses_a_state_field_alone():
    config = _config()
    del config["recurrent_state_dtypes"]
    with pytest.raises(ArtifactError, match="come together"):
        vllm_files.check_vllm_config(config, _manifest((1, 10)), 256)


@pytest.mark.serving
def test_pages_are_padded_to_one_position_of_vllms_groups():
    """vLLM groups 3 state layers + 1 attention layer as 1 attention group
    and 3 state groups (3 >= 1.5 x 1): every page covers all four."""
    pytest.importorskip("tpu_inference")
    from keras_vllm.serve.worker.state_caches import uniform_page_bytes

    assert uniform_page_bytes(1024, 4096, 1, 3) == 1024 + 3 * 4096
    # 4 attention + 5 state layers: one group of 5 each side.
    assert uniform_page_bytes(1024, 4096, 4, 5) == 1024 + 4096


@pytest.mark.serving
def test_cpu_cache_plan_counts_state_pages():
    """The CPU cap on KV memory (`cpu/kv_capacity.py`) counts every layer's
    pages, state layers' too: one state page per sequence (plus one)."""
    pytest.importorskip("tpu_inference")
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_interface import MambaSpec

    from keras_vllm.cpu import kv_capacity

    attention = FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float32
    )
    state = MambaSpec(
        shapes=STATE.shapes, dtypes=(torch.float32, torch.float32),
        block_size=64,
    )
    only_attention = kv_capacity.bytes_needed({"layer.3": attention}, 4, 64)
    both = kv_capacity.bytes_needed(
        {"layer.0": state, "layer.3": attention}, 4, 64
    )
    assert both - only_attention == 4 * 2 * STATE.bytes_per_sequence()


def test_inspect_counts_state_per_sequence_and_refuses_tensor_parallel():
    """`keras-vllm inspect`'s numbers: no KV bytes for state layers, their
    state per sequence beside; a TP size the linear-attention heads do not
    divide by is refused by name (heads read from the state shapes: 96 conv
    channels = 2 * 1 key head * 16 + 4 value heads * 16)."""
    from keras_vllm.load import tensor_parallel

    config = _config()
    assert capacity.state_bytes_per_sequence(config) == (
        3 * STATE.bytes_per_sequence()
    )
    rows = capacity.kv_by_kind(config, "float32")
    assert [(r["layers"], r["caches"]) for r in rows] == [(1, 1)]
    assert tensor_parallel.refusal(config, 1) is None
    reason, message = tensor_parallel.refusal(config, 2)
    assert "linear-attention heads" in reason
    assert "1 key heads and 4 value heads" in message
    assert "Sizes that work: 1." in message


def test_tensor_parallel_splits_linear_attention_by_heads():
    """2 key and 4 value heads (the tiny Qwen 3.5's linear layers): TP=2
    serves, TP=4 is refused; the attention heads' own rule still applies."""
    from keras_vllm.load import tensor_parallel

    state = StateSpec(
        shapes=((3, 128), (4, 16, 16)), dtypes=("float32", "float32")
    )
    config = _config()
    config.update(layout_fields([state, state, state, ATTENTION]))
    config.update(num_attention_heads=4, num_key_value_heads=2)
    assert tensor_parallel.refusal(config, 2) is None
    reason, message = tensor_parallel.refusal(config, 4)
    assert "2 key heads and 4 value heads" in message
    assert "Sizes that work: 1, 2." in message
    assert tensor_parallel.refusal(config, 3) is not None
