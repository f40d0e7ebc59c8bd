"""Paged attention for Gemma 3 (`CachedGemma3Attention`).

Mechanics: per-head RMSNorm of queries and keys (`query_norm`, `key_norm`)
before RoPE; each layer's own `RotaryEmbedding` (the backbone gives local,
sliding-window layers wavelength 10k times the local scaling factor and
global layers 1M times the global one, 5 local : 1 global), applied at
vLLM's positions, with no Gemma 1 half/interleave reorder; query scaling by
`head_dim` or `hidden_dim / num_heads`; optional attention logit soft cap;
the sliding window on local layers (`q - k < sliding_window_size`, as the
parent's `_mask_sliding_window`). The final logit soft cap lives in the
backbone's `ReversibleEmbedding`, so the backbone's own head applies it.
The bidirectional sliding window of embedding models is not causal
generation and is refused.
"""

from keras_hub.src.models.gemma3.gemma3_attention import CachedGemma3Attention

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common.gemma_attention import GemmaPagedAttention
from keras_vllm.layers.gemma import GEMMA_CHAT_TEMPLATE
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged


@register_paged(CachedGemma3Attention)
class PagedGemma3Attention(CachedGemma3Attention, GemmaPagedAttention):
    """`CachedGemma3Attention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        if self.use_bidirectional_attention:
            raise UnsupportedModelError(
                "Gemma 3 with bidirectional attention (an embedding model) "
                "is not a causal language model and cannot be served for "
                "generation."
            )
        return GemmaPagedAttention.kv_cache_spec(self)

    def call(
        self,
        x,
        attention_mask=None,
        cache=None,
        cache_update_index=0,
        cache_update_mask=None,
        training=False,
    ):
        positions = self.serving_positions()
        query = self.query_dense(x)
        key = self.key_dense(x)
        if self.use_query_key_norm:
            query = self.query_norm(query)
            key = self.key_norm(key)
        query = self.rope_layer(query, positions=positions)
        key = self.rope_layer(key, positions=positions)
        out = self.gemma_attend(query, key, self.value_dense(x))
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out

# Gemma 3's instruction-tuned presets chat as Gemma's.
register_chat_template(
    "Gemma3Tokenizer",
    GEMMA_CHAT_TEMPLATE,
    tokens=("<start_of_turn>", "<end_of_turn>"),
)
