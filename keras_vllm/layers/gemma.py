"""Paged attention for Gemma and Gemma 2 (`CachedGemmaAttention`).

Mechanics: Gemma's RoPE layout (rotate, then interleave halves; the
parent's `_apply_rope` does both), query scaling by `head_dim` or by
`hidden_dim / num_heads` (Gemma 2's query_pre_attn_scalar), attention logit
soft-cap, and a sliding window on the layers that use one. The final logit
soft-cap lives in the backbone's `ReversibleEmbedding` and so is applied by
the backbone's own head.
"""

from keras_hub.src.models.gemma.gemma_attention import CachedGemmaAttention

from keras_vllm.layers.common.gemma_attention import GemmaPagedAttention
from keras_vllm.layers.common.registry import register_paged


@register_paged(CachedGemmaAttention)
class PagedGemmaAttention(CachedGemmaAttention, GemmaPagedAttention):
    """`CachedGemmaAttention` over vLLM's paged KV cache."""

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
        out = self.gemma_attend(query, key, self.value_dense(x))
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out
