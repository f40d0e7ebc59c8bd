"""Paged attention for Phi-3 (`Phi3Attention`).

Mechanics: q/k/v projections without bias; grouped-query attention with
unexpanded K/V; softmax scale `1/sqrt(head_dim)`; RoPE at vLLM's positions,
either the plain `RotaryEmbedding` or, for `rope_scaling_type="su"`
(LongRoPE, the 128k presets), `Phi3SuScaledRotaryEmbedding`.

The "su" rotary divides each frequency by a short or a long factor, chosen
per call by the length the call covers (`start_index + seq_len >
pretraining_sequence_length`), and scales cos/sin by a constant. Its
`positions=` path assumes 1-D positions and keys the choice off the call's
own length, which is 1 in vLLM's layout, so this layer computes the rotary
itself, for each token with the factors Keras uses when it prefills the
prompt in one call and then decodes one token a call: a prompt token's by
the whole prompt's length, a generated token's by its position + 1. The
runner passes each token's prompt length (`ServingContext.prompt_lengths`,
`keras_vllm.serve.worker.prompt_lengths`), so this holds however vLLM
splits a prompt into prefill chunks (a chunk that ends before the
pretraining length, of a prompt that goes past it, gets the long factors
too) and when it recomputes a preempted request. (Keras' `generate()`
prefill keys the choice off the padded `max_length` instead, so a prompt at
or below the pretraining length whose prompt plus new tokens exceed it is
prefilled with the long factors there; vLLM has no padded length and
cannot reproduce that.)
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
    """Each token's sequence length as Keras' factors see it, `[T]` int32:
    its whole prompt's for a prompt token, its position + 1 for a generated
    one (`max(prompt length, position + 1)`)."""
    context = require_context(layer)
    lengths = ops.cast(context.positions, "int32") + 1
    if context.prompt_lengths is None:
        # No layer asked for them: served lengths stay within the
        # pretraining length (`needs_prompt_lengths`).
        return lengths
    return ops.maximum(ops.cast(context.prompt_lengths, "int32"), lengths)


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
        # A token's keys are rotated with the factors its request's prompt
        # length picks: a block cached by a short request holds
        # short-factor keys that a longer prompt over the same prefix (past
        # the pretraining length, all long factors in Keras) must not read.
        rope = self.rotary_embedding_layer
        return not (
            isinstance(rope, Phi3SuScaledRotaryEmbedding)
            and rope.max_sequence_length > rope.pretraining_sequence_length
        )

    def needs_prompt_lengths(self):
        # A prompt token's factors follow the whole prompt's length.
        return not PagedPhi3Attention.prefix_cacheable(self)

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
