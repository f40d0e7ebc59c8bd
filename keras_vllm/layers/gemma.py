"""Paged attention for Gemma and Gemma 2 (`CachedGemmaAttention`).

Mechanics: Gemma's RoPE layout (rotate, then interleave halves; the
parent's `_apply_rope` does both), query scaling by `head_dim` or by
`hidden_dim / num_heads` (Gemma 2's query_pre_attn_scalar), attention logit
soft-cap, and a sliding window on the layers that use one. The final logit
soft-cap lives in the backbone's `ReversibleEmbedding` and so is applied by
the backbone's own head.
"""

import math

from keras_hub.src.models.gemma.gemma_attention import CachedGemmaAttention

from keras_vllm.layers.base import KVCacheSpec
from keras_vllm.layers.base import PagedAttention
from keras_vllm.layers.registry import register_paged


def _sliding_window(layer):
    if layer.use_sliding_window_attention:
        return int(layer.sliding_window_size)
    return None


@register_paged(CachedGemmaAttention)
class PagedGemmaAttention(CachedGemmaAttention, PagedAttention):
    """`CachedGemmaAttention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            sliding_window=_sliding_window(self),
        )

    def call(
        self,
        x,
        attention_mask=None,
        cache=None,
        cache_update_index=0,
        training=False,
    ):
        positions = self.serving_positions()
        query = self._apply_rope(self.query_dense(x), 0, positions=positions)
        key = self._apply_rope(self.key_dense(x), 0, positions=positions)
        value = self.value_dense(x)
        if self.query_head_dim_normalize:
            scale = 1.0 / math.sqrt(self.head_dim)
        else:
            scale = 1.0 / math.sqrt(self.hidden_dim // self.num_query_heads)
        out = self.paged_attend(
            query,
            key,
            value,
            sm_scale=scale,
            sliding_window=_sliding_window(self),
            soft_cap=self.logit_soft_cap,
        )
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out
