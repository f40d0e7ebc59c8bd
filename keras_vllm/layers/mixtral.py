"""Paged attention for Mixtral (`CachedMixtralAttention`).

Mechanics: as Mistral (RoPE at vLLM's positions, grouped-query attention,
softmax scale `1/sqrt(head_dim)`, the decoder's sliding window
`q_pos - k_pos < sliding_window`). The sparse mixture-of-experts
feed-forward is not attention and runs as the backbone's own layer: it
routes each token independently, so vLLM's flat batch needs no change.
"""

from keras_hub.src.models.mixtral.mixtral_attention import (
    CachedMixtralAttention,
)

from keras_vllm.layers.base import KVCacheSpec
from keras_vllm.layers.base import PagedAttention
from keras_vllm.layers.registry import register_paged


def _sliding_window(layer):
    window = layer.sliding_window
    return None if window is None else int(window)


@register_paged(CachedMixtralAttention)
class PagedMixtralAttention(CachedMixtralAttention, PagedAttention):
    """`CachedMixtralAttention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
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
        query = rope(self.query_dense(hidden_states), positions=positions)
        key = rope(self.key_dense(hidden_states), positions=positions)
        value = self.value_dense(hidden_states)
        out = self.paged_attend(
            query,
            key,
            value,
            sm_scale=self._inv_norm_factor,
            sliding_window=_sliding_window(self),
        )
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out
