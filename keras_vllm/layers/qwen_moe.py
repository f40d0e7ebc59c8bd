"""Paged attention for Qwen MoE (Qwen 1.5 MoE, `QwenMoeAttention`).

Mechanics: as Qwen 2 (q/k/v biases, RoPE at vLLM's positions, grouped-query
attention, softmax scale `1/sqrt(head_dim)`). Unlike `QwenAttention`, this
layer's dense path skips the fused op on CPU (it uses it only on GPU/TPU), so
KerasHub applies `use_sliding_window_attention` there (`q_pos - k_pos <
sliding_window_size`); this layer follows that flag. The mixture-of-experts
feed-forward (with its shared expert) runs as the backbone's own layer
(per-token routing).
"""

from keras_hub.src.models.qwen_moe.qwen_moe_attention import QwenMoeAttention

from keras_vllm.layers.base import KVCacheSpec
from keras_vllm.layers.base import PagedAttention
from keras_vllm.layers.registry import register_paged


def _sliding_window(layer):
    if layer.use_sliding_window_attention:
        return int(layer.sliding_window_size)
    return None


@register_paged(QwenMoeAttention)
class PagedQwenMoeAttention(QwenMoeAttention, PagedAttention):
    """`QwenMoeAttention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.query_dense.kernel.shape[-1],
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
        out = self._output_dense(out)
        return (out, cache) if cache is not None else out
