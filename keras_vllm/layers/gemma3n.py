"""Paged attention for Gemma 3n's text decoder (`Gemma3nTextAttention`).

Mechanics: per-head RMSNorm of queries and keys (`q_norm`, `k_norm`)
before RoPE and a scale-free RMS norm of values (`v_norm`); attention scale
1.0 (the norms replace `1/sqrt(head_dim)`); each layer's own
`RotaryEmbedding` (the text model gives sliding-window layers
`rope_local_base_freq` and global layers `rope_theta`) at vLLM's
positions; the sliding window on local layers (`q - k < sliding_window`,
as the parent's `_mask_sliding_window`). The last `num_kv_shared_layers`
layers compute no keys or values: they attend over the cache of the last
earlier layer of the same kind (`Gemma3nTextModel.call`'s
`last_shared_cache[layer_type]`), declared with
`KVCacheSpec(shares_cache=True)` and attended with `update_kv_cache=False`.

Everything else Gemma 3n adds runs per token, so the backbone's own layers
compute it over vLLM's flat batch unchanged: AltUp's hidden-state streams
(predicted and corrected around each layer), the Laurel low-rank residual,
the per-layer inputs (a second embedding table and a projection of the
embeddings, gated into each layer) and the Gaussian top-k activation
sparsity of the first layers' FFNs. The decoder is nested in the backbone
(`language_model`); its logits come from its tied embedding with the
final soft cap (`backbone.token_embedding`, `gemma3n_fixes`).

A backbone with a vision or an audio encoder (every KerasHub preset)
serves its text decoder (registered below): text prompts only. Chat:
Gemma's turns (`GEMMA_CHAT_TEMPLATE`).
"""

from keras import ops
from keras_hub.src.models.gemma3n.gemma3n_attention import (
    Gemma3nTextAttention,
)
from keras_hub.src.models.gemma3n.gemma3n_backbone import Gemma3nBackbone

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_encoder_token_ids
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.registry import register_text_decoder
from keras_vllm.layers.gemma import GEMMA_CHAT_TEMPLATE


@register_paged(Gemma3nTextAttention)
class PagedGemma3nTextAttention(Gemma3nTextAttention, PagedAttention):
    """`Gemma3nTextAttention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        # Called on the KerasHub layer before it is swapped: parent state
        # only.
        return KVCacheSpec(
            num_query_heads=int(self.num_attention_heads),
            num_kv_heads=int(self.num_key_value_heads),
            head_dim=int(self.head_dim),
            sliding_window=self.sliding_window,
            shares_cache=bool(self.is_kv_shared_layer),
        )

    def _heads(self, x, heads):
        return ops.reshape(x, ops.shape(x)[:-1] + (heads, self.head_dim))

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=0,
        cache_update_mask=None,
        training=False,
    ):
        positions = self.serving_positions()
        rope = self.rotary_embedding
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        query = self.q_norm(self._heads(self.q_proj(hidden_states), heads))
        query = rope(query, positions=positions)
        if self.is_kv_shared_layer:
            # The source layer (earlier in the same step) wrote this step's
            # keys and values; the kernel reads them from its cache and
            # writes nothing. Zeros of the cache's shape stand in for the
            # keys it does not take.
            zeros = query[:, :, :kv_heads] * 0
            out = self.paged_attend(
                query, zeros, zeros, sm_scale=1.0,
                sliding_window=self.sliding_window, update_kv_cache=False,
            )
        else:
            key = self.k_norm(self._heads(self.k_proj(hidden_states), kv_heads))
            key = rope(key, positions=positions)
            value = self.v_norm(
                self._heads(self.v_proj(hidden_states), kv_heads)
            )
            out = self.paged_attend(
                query, key, value, sm_scale=1.0,
                sliding_window=self.sliding_window,
            )
            # The text model hands this to the layers that share this one's
            # cache (their paged call reads the paged cache instead), in
            # KerasHub's `[T, 2, heads, 1, head_dim]` layout: the decoder
            # block sizes its (unused) mask from it. XLA drops it.
            cache = ops.stack(
                (
                    ops.transpose(key, (0, 2, 1, 3)),
                    ops.transpose(value, (0, 2, 1, 3)),
                ),
                axis=1,
            )
        out = ops.reshape(out, ops.shape(out)[:-2] + (heads * self.head_dim,))
        return self.o_proj(out), None, cache


@register_text_decoder(Gemma3nBackbone)
def gemma3n_text_decoder(config):
    """Gemma 3n without its vision and audio encoders: the same decoder
    layers, names and variables (on a text prompt the full model embeds
    every id below the encoders' vocabulary offsets as the decoder alone
    does)."""
    if not config.get("vision_encoder_config") and not config.get(
        "audio_encoder_config"
    ):
        return None
    return dict(config, vision_encoder_config=None, audio_encoder_config=None)


@register_encoder_token_ids(Gemma3nBackbone)
def gemma3n_encoder_token_ids(config):
    """The encoders' own "hard" token ids: the whole model embeds ids from
    `vision_vocab_offset` up to the audio offset (or the vision vocabulary's
    end) with its vision embedder, and ids from `audio_vocab_offset` on with
    its audio embedder (keras-hub 0.32 `Gemma3nBackbone`), not its text
    table. In the presets these lie inside the text vocabulary (offsets
    262,144 and 262,272 of 262,400), e.g. `<image_soft_token>`."""
    ranges = []
    audio = config.get("audio_encoder_config") and config.get(
        "audio_vocab_offset"
    )
    if config.get("vision_encoder_config"):
        start = int(config["vision_vocab_offset"])
        stop = audio or start + int(config["vision_vocab_size"])
        ranges.append((start, int(stop)))
    if audio:
        ranges.append((int(audio), 2**31 - 1))
    return ranges


# Gemma 3n's instruction-tuned presets chat in Gemma's turns.
register_chat_template(
    "Gemma3nTokenizer",
    GEMMA_CHAT_TEMPLATE,
    tokens=("<start_of_turn>", "<end_of_turn>"),
)
