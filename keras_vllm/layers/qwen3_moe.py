"""Paged attention for Qwen 3 MoE (`Qwen3MoeAttention`).

Mechanics: as Qwen 3 (per-head q/k RMSNorm before RoPE at vLLM's
positions, explicit `head_dim`, grouped-query attention, softmax scale
`1/sqrt(head_dim)`). No sliding window: KerasHub applies
`sliding_window_size` (backbone default 32768) only on its non-fused path,
which never runs on JAX, so the Keras model (the reference) attends over the
whole context and so does this layer.

The sparse mixture-of-experts block is served routed
(`RoutedQwen3SparseMoeBlock`): Qwen MoE's router and experts (softmax,
top-k, renormalised when `norm_top_k_prob`; fused gate-and-up SwiGLU)
without a shared expert.
"""

from keras_hub.src.models.qwen3_moe.qwen3_moe_attention import (
    Qwen3MoeAttention,
)
from keras_hub.src.models.qwen3_moe.qwen3_moe_decoder import (
    Qwen3SparseMoeBlock,
)

from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.routed_experts import RoutedExperts
from keras_vllm.layers.qwen import CHATML_TOKENS
from keras_vllm.layers.qwen import CHATML_TURNS
from keras_vllm.layers.qwen3 import PagedQwen3Attention
from keras_vllm.layers.qwen_moe import QwenRoutedExperts


@register_paged(Qwen3MoeAttention)
class PagedQwen3MoeAttention(Qwen3MoeAttention, PagedAttention):
    """`Qwen3MoeAttention` over vLLM's paged KV cache.

    The attention has Qwen 3's sublayers and attribute names, so it runs
    Qwen 3's paged methods unchanged (plain functions; they only read
    attributes both classes define).
    """

    kv_cache_spec = PagedQwen3Attention.kv_cache_spec
    call = PagedQwen3Attention.call

# Its instruct presets chat in ChatML, without Qwen 2.5's default system.
register_chat_template("Qwen3MoeTokenizer", CHATML_TURNS, tokens=CHATML_TOKENS)


@register_paged(Qwen3SparseMoeBlock)
class RoutedQwen3SparseMoeBlock(Qwen3SparseMoeBlock, QwenRoutedExperts):
    """`Qwen3SparseMoeBlock` computing each token's top-k experts only (the
    Qwen MoE router and experts, without a shared expert)."""

    call = RoutedExperts.call
