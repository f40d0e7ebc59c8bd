"""Paged attention for Mistral (`CachedMistralAttention`).

Mechanics: RoPE (the parent's `RotaryEmbedding`, with its scaling factor)
applied at vLLM's positions; grouped-query attention with unexpanded K/V;
an explicit `head_dim` (which may differ from `hidden_dim / num_heads`);
softmax scale `1/sqrt(head_dim)`; and the sliding window that KerasHub
applies in the decoder's mask (`q_pos - k_pos < sliding_window`, the
kernel's convention), or none when `sliding_window` is None.
"""

from keras_hub.src.models.mistral.mistral_attention import (
    CachedMistralAttention,
)

from keras_vllm.layers.base import KVCacheSpec
from keras_vllm.layers.base import PagedAttention
from keras_vllm.layers.registry import register_paged


def _sliding_window(layer):
    window = layer._sliding_window
    return None if window is None else int(window)


@register_paged(CachedMistralAttention)
class PagedMistralAttention(CachedMistralAttention, PagedAttention):
    """`CachedMistralAttention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self._num_query_heads,
            num_kv_heads=self._num_key_value_heads,
            head_dim=self._head_dim,
            sliding_window=_sliding_window(self),
        )

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        positions = self.serving_positions()
        rope = self.rotary_embedding_layer
        query = rope(self._query_dense(hidden_states), positions=positions)
        key = rope(self._key_dense(hidden_states), positions=positions)
        value = self._value_dense(hidden_states)
        out = self.paged_attend(
            query,
            key,
            value,
            sm_scale=self._inv_norm_factor,
            sliding_window=_sliding_window(self),
        )
        out = self._output_dense(out)
        return (out, cache) if cache is not None else out
