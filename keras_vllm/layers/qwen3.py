"""Paged attention for Qwen 3 (`Qwen3Attention`).

Mechanics: per-head RMSNorm of queries and keys (the parent's
`Qwen3LayerNorm` layers) before RoPE, which is applied at vLLM's positions;
no projection biases; an explicit `head_dim`; grouped-query attention with
unexpanded K/V; softmax scale `1/sqrt(head_dim)`. No sliding window:
KerasHub applies `sliding_window_size` (backbone default 32768) only on its
non-fused path, which never runs on JAX, so the Keras model (the reference)
attends over the whole context and so does this layer.
"""

from keras_hub.src.models.qwen3.qwen3_attention import Qwen3Attention

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.qwen import CHATML_TOKENS
from keras_vllm.layers.qwen import CHATML_TURNS
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged


@register_paged(Qwen3Attention)
class PagedQwen3Attention(Qwen3Attention, PagedAttention):
    """`Qwen3Attention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
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
        query = self._query_dense_layer_norm(self._query_dense(hidden_states))
        query = rope(query, positions=positions)
        key = self._key_dense_layer_norm(self._key_dense(hidden_states))
        key = rope(key, positions=positions)
        value = self._value_dense(hidden_states)
        out = self.paged_attend(
            query, key, value, sm_scale=self._inv_norm_factor
        )
        out = self._output_dense(out)
        return (out, cache) if cache is not None else out

# Its instruct presets chat in ChatML, without Qwen 2.5's default system.
register_chat_template("Qwen3Tokenizer", CHATML_TURNS, tokens=CHATML_TOKENS)
