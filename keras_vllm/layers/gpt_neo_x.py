"""Paged attention for GPT-NeoX (`GPTNeoXAttention`).

Mechanics: one fused, biased QKV projection whose per-head output is
`[q | k | v]`; partial rotary embedding (the first
`int(head_dim * rotary_percentage)` features of q and k are rotated, the
rest pass through), applied at vLLM's positions; multi-head attention with
softmax scale `1/sqrt(head_dim)`. The parallel residual
(`ffn(x) + attn(x) + x`) lives in the decoder block, which runs unchanged.

KerasHub 0.32's own cached decoding is wrong: it caches pre-RoPE keys and
rotates the query and the whole cache without a start index, so a decode
step puts the query at position 0. Its `generate()` is therefore not the
reference for this family; the full forward pass is, and that is what this
layer matches (`keras_vllm.hub.reference.greedy_by_forward_pass`).
"""

from keras import ops
from keras_hub.src.models.gpt_neo_x.gpt_neo_x_attention import GPTNeoXAttention

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import rotate_partially


@register_paged(GPTNeoXAttention)
class PagedGPTNeoXAttention(GPTNeoXAttention, PagedAttention):
    """`GPTNeoXAttention` over vLLM's paged KV cache."""

    # KerasHub's cached decoding rotates decode queries at position 0.
    golden_reference = "forward_pass"

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim=self.attn_head_size,
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
        size, rotary = self.attn_head_size, self.rotary_dim
        qkv = self._qkv_dense(hidden_states)  # [T, 1, H, 3 * head_dim]
        query = qkv[..., :size]
        key = qkv[..., size : 2 * size]
        value = qkv[..., 2 * size :]
        rope = self.rotary_embedding_layer
        query = rotate_partially(rope, query, positions, rotary)
        key = rotate_partially(rope, key, positions, rotary)
        out = self.paged_attend(
            query, key, value, sm_scale=self._inv_norm_factor
        )
        out = ops.reshape(out, (ops.shape(out)[0], 1, self.hidden_dim))
        out = self._output_dense(out)
        # The parent always returns a pair; its decoder unpacks it.
        return out, cache
