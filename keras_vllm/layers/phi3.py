"""Paged attention for Phi-3 (`Phi3Attention`).

Mechanics: q/k/v projections without bias; grouped-query attention with
unexpanded K/V; softmax scale `1/sqrt(head_dim)`; RoPE at vLLM's positions,
either the plain `RotaryEmbedding` or, for `rope_scaling_type="su"`
(LongRoPE, the 128k presets), `Phi3SuScaledRotaryEmbedding`.

The "su" rotary divides each frequency by a short or a long factor, chosen
per forward pass by the sequence length it covers (`start_index + seq_len >
pretraining_sequence_length`), and scales cos/sin by a constant. Its
`positions=` path assumes 1-D positions and keys the choice off the call's
own length, which is 1 in vLLM's layout, so this layer computes the rotary
itself: each token uses the long factors when its sequence, up to the end
of this step (vLLM's `seq_lens`), is longer than the pretraining length.
That equals the Keras forward pass over the whole sequence and Keras' own
incremental decoding. (Keras' `generate()` prefill keys the choice off the
padded `max_length` instead, so a prompt at or below the pretraining length
whose prompt plus new tokens exceed it is prefilled with the long factors
there; vLLM has no padded length and cannot reproduce that.)
"""

from keras import ops
from keras_hub.src.models.phi3.phi3_attention import Phi3Attention
from keras_hub.src.models.phi3.phi3_rotary_embedding import (
    Phi3SuScaledRotaryEmbedding,
)

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import head_size
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.context import require_context
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged


def _sequence_lengths(layer):
    """Each token's sequence length at the end of this step, `[T]` int32."""
    context = require_context(layer)
    seq_lens = ops.convert_to_tensor(context.attention_metadata.seq_lens)
    return ops.take(seq_lens, context.token_requests(), axis=0)


def _su_scaled_rotary(rope, inputs, positions, use_long):
    """`Phi3SuScaledRotaryEmbedding` at per-token positions and factors.

    Args:
        rope: the layer's `Phi3SuScaledRotaryEmbedding`.
        inputs: `[T, 1, heads, head_dim]`.
        positions: `[T]` token positions.
        use_long: `[T]` bool, whether each token uses the long factors.
    """
    inverse_freq = rope._get_inverse_freq(ops.shape(inputs)[-1])
    factor = ops.where(
        use_long[:, None],
        ops.convert_to_tensor(rope.inverese_freq_long_factor)[None, :],
        ops.convert_to_tensor(rope.inverese_freq_short_factor)[None, :],
    )
    inverse_freq = ops.divide(inverse_freq[None, :], factor)
    freq = ops.cast(positions, "float32")[:, None] * inverse_freq
    embedding = ops.stack((freq, freq), axis=-2)
    embedding = ops.reshape(embedding, (ops.shape(freq)[0], 1, 1, -1))
    scale = rope.embedding_scaling_factor
    cos_emb = ops.cast(ops.cos(embedding) * scale, rope.compute_dtype)
    sin_emb = ops.cast(ops.sin(embedding) * scale, rope.compute_dtype)
    return rope._apply_rotary_pos_emb(inputs, cos_emb, sin_emb)


@register_paged(Phi3Attention)
class PagedPhi3Attention(Phi3Attention, PagedAttention):
    """`Phi3Attention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_size(self.query_dense),
        )

    def prefix_cacheable(self):
        # Keys are rotated with the factors for their sequence's length at
        # the step that wrote them: a block cached by a short request holds
        # short-factor keys that a longer prompt over the same prefix (past
        # the pretraining length, all long factors in Keras) must not read.
        rope = self.rotary_embedding_layer
        return not (
            isinstance(rope, Phi3SuScaledRotaryEmbedding)
            and rope.max_sequence_length > rope.pretraining_sequence_length
        )

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        query = self.query_dense(hidden_states)
        key = self.key_dense(hidden_states)
        value = self.value_dense(hidden_states)
        rope = self.rotary_embedding_layer
        if isinstance(rope, Phi3SuScaledRotaryEmbedding):
            positions = require_context(self).positions
            lengths = _sequence_lengths(self)
            use_long = lengths > rope.pretraining_sequence_length
            query = _su_scaled_rotary(rope, query, positions, use_long)
            key = _su_scaled_rotary(rope, key, positions, use_long)
        else:
            positions = self.serving_positions()
            query = rope(query, positions=positions)
            key = rope(key, positions=positions)
        out = self.paged_attend(
            query, key, value, sm_scale=self._inv_norm_factor
        )
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out


# Phi-3 instruct: `<|role|>\n...<|end|>\n` per message.
register_chat_template(
    "Phi3Tokenizer",
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    tokens=("<|user|>", "<|assistant|>", "<|end|>"),
)
