"""GPT-OSS's paged attention: the KV cache facts it gives vLLM.

Unit level (no engine). The served path (greedy tokens, prompt logprobs,
golden outputs) is checked by the family serving tests; the routed experts
by `test_routed_experts.py`; sinks through the kernel by
`tests/cpu/test_cpu_paged_attention.py`.
"""

import keras_hub
import pytest

import keras_vllm
from keras_vllm import testing
from keras_vllm.export.kv_layout import kv_layout
from keras_vllm.layers import swap


def _backbone(**overrides):
    config = testing.backbone_config("gpt_oss", **overrides)
    return testing.backbone_class("gpt_oss")(**config, vocabulary_size=64)


def test_windows_follow_each_keras_layer():
    """KerasHub windows the odd layers (the opposite of Hugging Face's
    alternation); each windowed layer's cache and attention use the window
    plus one (KerasHub keeps `q - k <= W`, the kernel `q - k < W`)."""
    backbone = _backbone(num_layers=4)
    windows = [
        layer.sliding_window for layer in swap.find_attention_layers(backbone)
    ]
    assert windows == [None, 16, None, 16]
    specs = swap.kv_cache_specs(backbone)
    assert [s.sliding_window for s in specs] == [None, 17, None, 17]
    assert {(s.num_query_heads, s.num_kv_heads, s.head_dim) for s in specs} \
        == {(4, 2, 64)}
    fields = kv_layout(backbone)
    assert fields["layer_types"] == [
        "full_attention", "sliding_attention"
    ] * 2
    assert fields["sliding_window"] == 17

    # The layer's own attribute decides, not its index.
    layers = swap.find_attention_layers(backbone)
    layers[0].sliding_window = 8
    layers[1].sliding_window = None
    windows = [s.sliding_window for s in swap.kv_cache_specs(backbone)]
    assert windows == [9, None, None, 17]


def test_other_head_sizes_are_refused_by_name(tmp_path):
    causal_lm = keras_hub.models.GptOssCausalLM(
        backbone=_backbone(head_dim=16), preprocessor=None
    )
    with pytest.raises(keras_vllm.UnsupportedModelError) as raised:
        keras_vllm.export_vllm(causal_lm, tmp_path / "a")
    message = str(raised.value)
    assert "GptOssCausalLM" in message
    assert "head_dim 16" in message and "head_dim=64" in message
    assert not (tmp_path / "a").exists()
