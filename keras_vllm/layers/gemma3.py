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
generation and is refused. A backbone with a vision encoder serves images
when its preprocessor takes them: its image settings (the preprocessor's
placeholder expansion and image converter) and its backbone split where
images enter are registered below (`modalities.image`, served by
`serve/worker/image_model.py`); without an image converter it serves its
text decoder (registered below): text prompts only.
"""

from keras_hub.src.models.gemma3.gemma3_attention import CachedGemma3Attention
from keras_hub.src.models.gemma3.gemma3_backbone import Gemma3Backbone
from keras import ops

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common.gemma_attention import GemmaPagedAttention
from keras_vllm.layers.common.image_inputs import chat_content_jinja
from keras_vllm.layers.common.image_inputs import plain_number
from keras_vllm.layers.common.image_inputs import register_image_inputs
from keras_vllm.layers.common.image_inputs import register_image_model
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.registry import register_text_decoder


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

# Gemma 3's instruction-tuned presets chat as Gemma's, and a message's
# content may also be a list of parts (OpenAI chat): each image part is
# written as the image marker where it stands, the place the preprocessor
# expands it (`<start_of_image>`, `gemma3_image_inputs`), and each text part
# trimmed, as Gemma 3's own chat format writes them. vLLM passes content as
# parts to a template that loops over them; string content renders exactly
# as `GEMMA_CHAT_TEMPLATE` does.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set state = namespace(system='', text='') %}"
    "{% for m in messages %}"
    + chat_content_jinja("<start_of_image>")
    + "{% if m['role'] == 'system' %}"
    "{% set state.system = state.text ~ '\\n\\n' %}"
    "{% else %}"
    "<start_of_turn>{{ 'model' if m['role'] in ('assistant', 'model') "
    "else 'user' }}\n{{ state.system }}{{ state.text }}"
    "<end_of_turn>\n{% set state.system = '' %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
register_chat_template(
    "Gemma3Tokenizer",
    GEMMA3_CHAT_TEMPLATE,
    tokens=("<start_of_turn>", "<end_of_turn>"),
)


@register_text_decoder(Gemma3Backbone)
def gemma3_text_decoder(config):
    """Gemma 3 without its vision encoder: the same decoder layers, names
    and variables (`Gemma3Backbone` builds no interleaving layer then, and
    on a text prompt the full model's image mask is all False, so every
    layer attends causally as the text-only model does)."""
    if config.get("vision_encoder") is None:
        return None
    return dict(config, vision_encoder=None)


@register_image_inputs(Gemma3Backbone)
def gemma3_image_inputs(causal_lm):
    """Gemma 3's image settings, read from its preprocessor.

    `Gemma3CausalLMPreprocessor` replaces each `<start_of_image>` a prompt
    holds with `"\\n\\n<start_of_image>" + "<img>" * tokens_per_image +
    "<end_of_image>\\n\\n"` before tokenizing; the backbone's decoder
    blocks let each contiguous run of `<img>` tokens attend to itself in
    both directions (`_compute_image_bidirectional_attention_mask`).
    """
    preprocessor = causal_lm.preprocessor
    converter = getattr(preprocessor, "image_converter", None)
    if causal_lm.backbone.vision_encoder is None or converter is None:
        return None
    tokenizer = preprocessor.tokenizer
    marker = tokenizer.start_of_image_token
    return {
        "converter": {
            "image_size": [int(n) for n in converter.image_size],
            "scale": plain_number(converter.scale),
            "offset": plain_number(converter.offset),
            "interpolation": converter.interpolation,
            "antialias": bool(converter.antialias),
            "crop_to_aspect_ratio": bool(converter.crop_to_aspect_ratio),
            "pad_to_aspect_ratio": bool(converter.pad_to_aspect_ratio),
        },
        "encoder_image_size": int(causal_lm.backbone.image_size),
        "tokens_per_image": int(preprocessor.num_vision_tokens_per_image),
        "max_images_per_prompt": int(preprocessor.max_images_per_prompt),
        "marker": marker,
        "expansion": {
            "before": f"\n\n{marker}",
            "placeholder": tokenizer.image_placeholder,
            "after": f"{tokenizer.end_of_image_token}\n\n",
        },
        "placeholder_token_id": int(tokenizer.image_placeholder_id),
        "attention": "bidirectional_within_image",
    }


@register_image_model(Gemma3Backbone)
class Gemma3Images:
    """Gemma 3's backbone graph, split where images enter it.

    `Gemma3Backbone` scales text embeddings by `sqrt(hidden_dim)`, then
    scatters the vision encoder's rows (unscaled) into the placeholders'
    places (`Gemma3InterleaveEmbeddings`) and runs the decoder blocks with
    the placeholders' `vision_mask` (which makes each image's run of
    placeholders attend to itself in both directions).
    """

    @staticmethod
    def embed_images(backbone, pixel_values):
        # The encoder takes `(batch, images, H, W, 3)` and returns one
        # `(tokens, hidden)` block per image.
        return backbone.vision_encoder(ops.expand_dims(pixel_values, 0))

    @staticmethod
    def embed_tokens(backbone, token_ids):
        x = backbone.token_embedding(token_ids)
        return x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)

    @staticmethod
    def decode(
        backbone, embeddings, padding_mask, vision_mask, token_ids=None,
        image_mask=None,
    ):
        # Gemma 3's layers read only the embeddings.
        x = embeddings
        for layer in backbone.transformer_layers:
            x = layer(x, padding_mask=padding_mask, vision_mask=vision_mask)
        return backbone.layer_norm(x)
