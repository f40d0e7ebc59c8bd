"""Paged attention for Mixtral (`CachedMixtralAttention`).

Mechanics: as Mistral (RoPE at vLLM's positions, grouped-query attention,
softmax scale `1/sqrt(head_dim)`, the decoder's sliding window
`q_pos - k_pos < sliding_window`).

The sparse mixture-of-experts block is served routed
(`RoutedMixtralSparseMoeBlock`): softmax over the experts, top-k,
renormalised to sum to one; each expert a SwiGLU with separate gate and up
kernels, its SiLU in float32 as KerasHub computes it.
"""

from keras import ops
from keras_hub.src.models.mixtral.mixtral_attention import (
    CachedMixtralAttention,
)
from keras_hub.src.models.mixtral.mixtral_decoder import MixtralSparseMoeBlock

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention
from keras_vllm.layers.common.routed_experts import RoutedExperts
from keras_vllm.layers.common.routed_experts import softmax_top_k
from keras_vllm.layers.mistral import MISTRAL_CHAT_TEMPLATE


@register_paged(CachedMixtralAttention)
class PagedMixtralAttention(CachedMixtralAttention, RotaryPagedAttention):
    """`CachedMixtralAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")

    def kv_cache_spec(self):
        window = self.sliding_window
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self._head_dim,
            sliding_window=None if window is None else int(window),
        )

# Mixtral's instruct preset chats as Mistral's.
register_chat_template("MixtralTokenizer", MISTRAL_CHAT_TEMPLATE)


@register_paged(MixtralSparseMoeBlock)
class RoutedMixtralSparseMoeBlock(MixtralSparseMoeBlock, RoutedExperts):
    """`MixtralSparseMoeBlock` computing each token's top-k experts only."""

    call = RoutedExperts.call

    def route(self, tokens):
        logits = self._sparse_feedforward_gate_dense(tokens)
        weights, experts = softmax_top_k(logits, self.top_k, renormalize=True)
        return logits, weights, experts

    def expert_kernels(self):
        bank = self.expert_bank
        return (
            bank._expert_feedforward_gate_dense,
            bank._expert_feedforward_intermediate_dense,
        ), bank._expert_feedforward_output_dense

    def expert_hidden(self, gate, up):
        bank = self.expert_bank
        gate = bank.activation(ops.cast(gate, "float32"))
        return up * ops.cast(gate, bank.compute_dtype)
