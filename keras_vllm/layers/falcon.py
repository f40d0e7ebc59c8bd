"""Paged attention for Falcon (`FalconAttention`).

Mechanics: multi-head attention with biased q/k/v projections and ALiBi
positions. KerasHub's Falcon adds the bias *before* the softmax scale:
`(q . k + slope * k_pos) / sqrt(head_dim)`, with the standard slopes
(`max_bias` 8) built by `FalconTransformerDecoder`. The decoder still
computes and passes its `alibi` tensor; this layer ignores it and uses
`slope / sqrt(head_dim)` per unit of `k_pos - q_pos` in the shared ALiBi
paged attention (equal under softmax).
"""

from keras import ops
from keras_hub.src.models.falcon.falcon_attention import FalconAttention

from keras_vllm.layers.common.alibi_attention import alibi_slopes
from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.registry import register_paged


@register_paged(FalconAttention)
class PagedFalconAttention(FalconAttention, PagedAttention):
    """`FalconAttention` over vLLM's paged KV cache, with ALiBi."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim=self.head_dim,
        )

    def call(
        self,
        inputs,
        alibi=None,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        scale = self.inv_norm_factor
        out = self.paged_attend(
            self.query_dense(inputs),
            self.key_dense(inputs),
            self.value_dense(inputs),
            sm_scale=scale,
            # Falcon scales the bias together with q . k.
            alibi_slopes=[s * scale for s in alibi_slopes(self.num_heads)],
        )
        out = ops.reshape(out, (ops.shape(out)[0], 1, -1))
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out
