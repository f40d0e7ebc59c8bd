"""Paged layers for GPT-2-style models (`CachedMultiHeadAttention` and the
learned absolute `PositionEmbedding`).

Mechanics: multi-head attention with biased q/k/v projections and softmax
scale `1/sqrt(key_dim)`; no rotary positions. Positions enter as learned
embeddings added to the token embeddings, so the position embedding must
look up vLLM's per-token positions rather than `0..T-1` of the flat batch.
"""

from keras import ops
from keras_hub.src.layers.modeling.cached_multi_head_attention import (
    CachedMultiHeadAttention,
)
from keras_hub.src.layers.modeling.position_embedding import PositionEmbedding

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.base import PagedPositionLayer
from keras_vllm.layers.common.registry import register_paged


@register_paged(CachedMultiHeadAttention)
class PagedCachedMultiHeadAttention(CachedMultiHeadAttention, PagedAttention):
    """`CachedMultiHeadAttention` (decoder self-attention) over vLLM's cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self._num_heads,
            num_kv_heads=self._num_heads,
            head_dim=self._key_dim,
        )

    def call(
        self,
        query,
        value,
        key=None,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        if return_attention_scores or (key is not None and key is not value):
            raise ValueError(
                "Paged attention serves decoder self-attention only; "
                "attention scores and cross-attention are not available."
            )
        out = self.paged_attend(
            self._query_dense(query),
            self._key_dense(value),
            self._value_dense(value),
            sm_scale=float(self._key_dim) ** -0.5,
        )
        out = self._output_dense(out)
        return (out, cache) if cache is not None else out


@register_paged(PositionEmbedding)
class PagedPositionEmbedding(PositionEmbedding, PagedPositionLayer):
    """`PositionEmbedding` that embeds vLLM's per-token positions."""

    def call(self, inputs, start_index=0, positions=None):
        table = ops.convert_to_tensor(self.position_embeddings)
        # Tokens arrive as T sequences of one token: `inputs` is [T, 1, D].
        embedded = ops.take(table, self.serving_positions(), axis=0)
        return ops.reshape(embedded, ops.shape(inputs))
