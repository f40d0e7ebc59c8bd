"""Gemma 4 served with images: its image settings and its backbone split.

KerasHub 0.32's Gemma 4 takes images at variable resolution:

* `Gemma4ImageConverter` resizes each image keeping its aspect ratio to at
  most `max_soft_tokens * pooling_kernel_size**2` patches of `patch_size`
  pixels (sides multiples of `patch_size * pooling_kernel_size`, bicubic,
  antialiased, clipped to 0-255), rescales, and flattens it into
  `pixel_values` `(P, 3 * patch_size**2)` with `pixel_position_ids`
  `(P, 2)` ((x, y) per patch), zero patches at (-1, -1) up to
  `P = max_soft_tokens * pooling_kernel_size**2`;
* `Gemma4VisionEncoder` pools each image's patches by their positions to
  `max_soft_tokens` rows (rows past a non-square image's own are zeros) and
  projects them to the text width; its pooled-grid width is the widest
  image's of the call, so the encoder here runs one image per call (as
  KerasHub's, whose images of one prompt share a size);
* `Gemma4CausalLMPreprocessor` replaces each `<|image|>` of a prompt with
  `"<|image>" + "<|image|>" * num_vision_tokens_per_image + "<image|>"`;
  `Gemma4InterleaveEmbeddings` fills those placeholders with each image's
  first `num_vision_tokens_per_image` rows;
* `Gemma4Backbone` scales the image rows by `hidden_dim ** -0.5` before
  merging and the merged embeddings by `sqrt(hidden_dim)` after;
* with `use_vision_bidirectional_attention` (the 26B / 31B presets) the
  placeholders of one image attend to each other in both directions on
  the sliding-window layers only ((causal and window) or same image); the
  global layers stay causal (`PagedGemma4TextAttention` attends them with
  `image_spans=False`); without it (E2B / E4B) every layer is causal;
* with per-layer embeddings (E2B / E4B) each layer also takes a per-layer
  input from the token ids, image placeholders read as id 0 (as Hugging
  Face masks them), and from the merged embeddings (image rows included):
  `decode` computes them as the backbone does from the ids and placeholder
  mask the served model class passes.

What is not served with images (the artifact then serves the text decoder,
text prompts only, as before): bidirectional images with KV-shared layers
(the image-span kernel writes the cache it reads; a KV-shared layer reads
another layer's, so its placeholders could not see their image's later
rows) or with an image longer than the sliding window
(the kernel's window around an image is `|q - k| < window`, equal to
KerasHub's only for images within the window). Audio and video are not
served.
"""

from keras import ops
from keras_hub.src.models.gemma4.gemma4_backbone import Gemma4Backbone

from keras_vllm.layers.common.image_inputs import plain_number
from keras_vllm.layers.common.image_inputs import register_image_inputs
from keras_vllm.layers.common.image_inputs import register_image_model


@register_image_inputs(Gemma4Backbone)
def gemma4_image_inputs(causal_lm):
    """Gemma 4's image settings, read from its preprocessor (None when
    the model takes no image or cannot be served exactly with one: see the
    module docstring)."""
    backbone = causal_lm.backbone
    preprocessor = causal_lm.preprocessor
    converter = getattr(preprocessor, "image_converter", None)
    if backbone.vision_encoder is None or converter is None:
        return None
    if not _servable_with_images(backbone, preprocessor):
        return None
    tokenizer = preprocessor.tokenizer
    blocks = backbone.transformer_layers
    bidirectional = any(
        block.use_vision_bidirectional_attention for block in blocks
    )
    return {
        "converter": {
            "kind": "patches",
            "patch_size": int(converter.patch_size),
            "max_soft_tokens": int(converter.max_soft_tokens),
            "pooling_kernel_size": int(converter.pooling_kernel_size),
            "scale": plain_number(converter.scale),
            "offset": plain_number(converter.offset),
        },
        "encoder_image_size": int(backbone.image_size),
        "tokens_per_image": int(preprocessor.num_vision_tokens_per_image),
        "max_images_per_prompt": int(preprocessor.max_images_per_prompt),
        "marker": preprocessor.image_placeholder,
        "expansion": {
            "before": preprocessor.start_of_image_token,
            "placeholder": preprocessor.image_placeholder,
            "after": preprocessor.end_of_image_token,
        },
        "placeholder_token_id": int(tokenizer.image_placeholder_id),
        "attention": (
            "bidirectional_within_image" if bidirectional else "causal"
        ),
    }


def _servable_with_images(backbone, preprocessor):
    """Whether the served split below computes what KerasHub does."""
    tokens = int(preprocessor.num_vision_tokens_per_image)
    converter = preprocessor.image_converter
    if tokens > int(converter.max_soft_tokens):
        return False  # KerasHub's interleaving fails on it too.
    for block in backbone.transformer_layers:
        if not block.use_vision_bidirectional_attention:
            continue
        if block.is_kv_shared_layer:
            return False
        if block.use_sliding_window_attention and not (
            block.is_global_attention
        ) and tokens > int(block.sliding_window_size):
            return False
    return True


@register_image_model(Gemma4Backbone)
class Gemma4Images:
    """Gemma 4's backbone graph, split where images enter it (dense and
    MoE decoders, and E2B / E4B with per-layer embeddings)."""

    # KerasHub 0.32's cached `generate()` attends causally among an image's
    # placeholders (its decoder blocks add the image mask only without a
    # cache); the forward pass, which keras-vllm serves, attends both ways.
    generate_is_exact = False

    @staticmethod
    def embed_images(backbone, pixel_values, pixel_position_ids):
        # One image per encoder call: the pooling's grid width is the
        # call's widest image's.
        rows = []
        for i in range(pixel_values.shape[0]):
            out = backbone.vision_encoder({
                "pixel_values": pixel_values[i][None, None],
                "pixel_position_ids": pixel_position_ids[i][None, None],
            })
            rows.append(out[0, 0])
        rows = ops.stack(rows)
        return rows * ops.cast(float(backbone.hidden_dim) ** -0.5, rows.dtype)

    @staticmethod
    def embed_tokens(backbone, token_ids):
        # Unscaled: the backbone scales after merging the image rows.
        return backbone.token_embedding(token_ids)

    @staticmethod
    def decode(
        backbone, embeddings, padding_mask, vision_mask, token_ids=None,
        image_mask=None,
    ):
        x = embeddings * ops.cast(
            ops.sqrt(backbone.hidden_dim), embeddings.dtype
        )
        per_layer = _per_layer_inputs(backbone, x, token_ids, image_mask)
        shared = {}
        for i, layer in enumerate(backbone.transformer_layers):
            shared_kv = None
            if layer.is_kv_shared_layer:
                shared_kv = shared.get(layer.kv_shared_layer_index)
            x, shared[i] = layer(
                x, padding_mask=padding_mask, vision_mask=vision_mask,
                per_layer_input=None if per_layer is None else per_layer[i],
                shared_kv=shared_kv,
            )
        return backbone.layer_norm(x)


def _per_layer_inputs(backbone, x, token_ids, image_mask):
    """Each layer's per-layer input (E2B / E4B), or None without them.

    As `Gemma4Backbone`'s graph: an embedding of the token ids (image
    placeholders read id 0, the pad id, as Hugging Face masks them) scaled
    by `sqrt(width)`, plus the RMS-normed projection of the merged, scaled
    embeddings `x` (image rows included) scaled by `hidden_dim ** -0.5`,
    each layer's slice summed and scaled by `2 ** -0.5`.
    """
    width = int(backbone.hidden_size_per_layer_input)
    if width <= 0:
        return None
    if token_ids is None or image_mask is None:
        raise ValueError(
            "Gemma 4 with per-layer embeddings decodes from its token ids "
            "and image placeholder mask too (`token_ids=`, `image_mask=`)."
        )
    ids = ops.where(
        ops.cast(image_mask, "bool"), ops.zeros_like(token_ids), token_ids
    )
    embedded = ops.cast(backbone.per_layer_token_embedding(ids), x.dtype)
    embedded = embedded * ops.cast(float(width) ** 0.5, x.dtype)
    projected = backbone.per_layer_model_projection(x)
    projected = projected * ops.cast(
        float(backbone.hidden_dim) ** -0.5, projected.dtype
    )
    half = ops.cast(2.0**-0.5, x.dtype)
    return [
        (backbone.per_layer_projection_norm(
            projected[:, :, i * width:(i + 1) * width]
        ) + embedded[:, :, i * width:(i + 1) * width]) * half
        for i in range(len(backbone.transformer_layers))
    ]
