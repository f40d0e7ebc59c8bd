"""Paged attention for Bloom (`BloomAttention`).

Mechanics: multi-head attention with biased q/k/v projections and ALiBi
positions. KerasHub's Bloom adds the bias *after* the softmax scale:
`q . k / sqrt(head_dim) + slope * (k_pos - (kv_len - 1))`, with the
layer's `AlibiBias` slopes (`alibi_bias_max`, 8 by default). Serving never
calls `AlibiBias` (it mutates layer state while tracing under NNX); the
slopes are computed here from its `alibi_bias_max` and applied per unit of
`k_pos - q_pos` by the shared ALiBi paged attention (equal under softmax).
"""

from keras import ops
from keras_hub.src.models.bloom.bloom_attention import BloomAttention

from keras_vllm.layers.common.alibi_attention import alibi_slopes
from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.registry import register_paged


@register_paged(BloomAttention)
class PagedBloomAttention(BloomAttention, PagedAttention):
    """`BloomAttention` over vLLM's paged KV cache, with ALiBi."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim=self.head_dim,
        )

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        slopes = alibi_slopes(
            self.num_heads, max_bias=self._alibi_layer.alibi_bias_max
        )
        out = self.paged_attend(
            self._query_dense(hidden_states),
            self._key_dense(hidden_states),
            self._value_dense(hidden_states),
            sm_scale=self.inv_norm_factor,
            alibi_slopes=slopes,
        )
        out = ops.reshape(out, (ops.shape(out)[0], 1, -1))
        out = self._output_dense(out)
        return (out, cache) if cache is not None else out
