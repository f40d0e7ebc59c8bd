"""Paged attention for SmolLM3 (`SmolLM3Attention`).

Mechanics: q/k/v projections (with biases when `attention_bias`); grouped-
query attention with unexpanded K/V; softmax scale `1/sqrt(head_dim)`;
RoPE from the layer's own `SmolLM3RotaryEmbedding.inv_freq` on most layers
and none at all ("NoPE") where the backbone's `rope_layer_enabled_list`
says so (the 3B preset leaves every 4th layer without positions). KerasHub
takes the cache through `**kwargs`, so this layer is found by its
registration, not by its signature (`keras_vllm.layers.swap`).

`SmolLM3RotaryEmbedding` counts positions from a start index over its
input's sequence axis (`arange(seq_len) + start_index`) and has no
`positions=` argument; vLLM's flat batch needs one position per token, so
cos and sin are computed here from the same `inv_freq` and
`attention_scaling`, the same float32 product and the same cast, at vLLM's
positions.

keras-hub 0.32's SmolLM3 layers also need fixes before keras-vllm can use
them at all (under NNX, and for unique variable paths); they are in
`keras_vllm.layers.smollm3_fixes`, installed on import.
"""

from keras import ops
from keras_hub.src.models.smollm3.smollm3_layers import SmolLM3Attention
from keras_hub.src.models.smollm3.smollm3_utils import apply_rotary_pos_emb

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.context import require_context
from keras_vllm.layers.common.registry import register_paged


def _rotary_cos_sin(rope, positions, dtype):
    """`SmolLM3RotaryEmbedding`'s cos and sin at per-token positions.

    Args:
        rope: the layer's `SmolLM3RotaryEmbedding`.
        positions: `[T]` int token positions.
        dtype: the dtype of the query (the rotary layer's output cast).

    Returns:
        `(cos, sin)`, each `[T, 1, rotary_dim]`: the shape the rotary layer
        returns for a batch of T sequences of one token.
    """
    positions = ops.cast(positions, "float32")[:, None]
    freqs = positions * ops.cast(rope.inv_freq, "float32")[None, :]
    emb = ops.concatenate((freqs, freqs), axis=-1)[:, None, :]
    cos = ops.cos(emb) * rope.attention_scaling
    sin = ops.sin(emb) * rope.attention_scaling
    return ops.cast(cos, dtype), ops.cast(sin, dtype)


@register_paged(SmolLM3Attention)
class PagedSmolLM3Attention(SmolLM3Attention, PagedAttention):
    """`SmolLM3Attention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        rotary_dim = 2 * int(self.rotary_embedding.inv_freq.shape[0])
        if self.use_rope and rotary_dim != self.head_dim:
            # KerasHub's own layer cannot run it either: its cos/sin cover
            # `rotary_dim` and are multiplied into the whole head.
            raise UnsupportedModelError(
                "SmolLM3 with partial_rotary_factor="
                f"{self.partial_rotary_factor} (rotary size {rotary_dim} of "
                f"head size {self.head_dim}) is not supported: KerasHub's "
                "SmolLM3Attention rotates whole heads only. Use "
                "partial_rotary_factor=1.0."
            )
        return KVCacheSpec(
            num_query_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
        )

    def call(self, hidden_states, training=False, attention_mask=None, **kwargs):
        tokens = ops.shape(hidden_states)[:-1]
        query = ops.reshape(
            self.q_proj(hidden_states),
            (*tokens, self.num_attention_heads, self.head_dim),
        )
        kv_shape = (*tokens, self.num_key_value_heads, self.head_dim)
        key = ops.reshape(self.k_proj(hidden_states), kv_shape)
        value = ops.reshape(self.v_proj(hidden_states), kv_shape)
        if self.use_rope:
            cos, sin = _rotary_cos_sin(
                self.rotary_embedding,
                require_context(self).positions,
                query.dtype,
            )
            query, key = apply_rotary_pos_emb(
                query, key, cos, sin, expansion_axis=2
            )
        out = self.paged_attend(
            query, key, value, sm_scale=self._inv_norm_factor
        )
        return self.o_proj(out)
