"""Paged attention for Llama and Llama 3 (`LlamaAttention`).

Mechanics: RoPE (with Llama 3.1 frequency scaling, handled by the parent's
`LlamaRotaryEmbedding`) applied at vLLM's positions; grouped-query
attention with unexpanded K/V; softmax scale `1/sqrt(head_dim)`.
"""

from keras_hub.src.models.llama.llama_attention import LlamaAttention

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import head_size
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention


@register_paged(LlamaAttention)
class PagedLlamaAttention(LlamaAttention, RotaryPagedAttention):
    """`LlamaAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_size(self._query_dense),
        )
