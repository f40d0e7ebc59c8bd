"""Tiny Gemma 4 vision-language models built from a trained text fixture.

`with_image_preprocessor` adds a (random) tiny `Gemma4VisionEncoder` to a
trained tiny Gemma 4 (its decoder weights are the trained ones), turns on
the 26B / 31B presets' bidirectional attention within images (off for an
E2B / E4B-like model, as in those presets), and gives it
KerasHub's `Gemma4CausalLMPreprocessor` with a tiny variable-resolution
image converter: patches of 4 pixels, at most 4 soft tokens (16 patches,
pooled 2 x 2) per image, 4 placeholder tokens per image, as the presets
ship (16-pixel patches, 280 soft tokens pooled 3 x 3).
"""

from helpers import vision_backbones

PATCH_SIZE = 4
MAX_SOFT_TOKENS = 4
POOLING = 2
TOKENS_PER_IMAGE = 4
MARKER = "<|image|>"


def with_vision_encoder(
    text_lm, preprocessor=None, bidirectional=True, seed=0
):
    """`text_lm` (a Gemma 4 `CausalLM`) with a tiny vision encoder added
    and `use_vision_bidirectional_attention` set to `bidirectional`. The
    encoder is named as in keras-hub's presets (an auto-numbered name
    differs between two models built in one process)."""
    import keras
    import keras_hub
    from keras_hub.src.models.gemma4.gemma4_vision_encoder import (
        Gemma4VisionEncoder,
    )

    # The encoder's weights are random: seeded, so that every process
    # builds the same model whatever ran before it (a test comparing
    # two references on it must not depend on test order).
    keras.utils.set_random_seed(seed)
    config = text_lm.backbone.get_config()
    config["vision_encoder"] = Gemma4VisionEncoder(
        image_size=16, patch_size=PATCH_SIZE, num_heads=2, hidden_dim=16,
        num_layers=1, intermediate_dim=32, head_dim=8,
        output_dim=config["hidden_dim"], pool_size=POOLING,
        position_embedding_size=16, name="gemma4_vision_encoder",
    )
    config["image_size"] = 16
    config["use_vision_bidirectional_attention"] = bidirectional
    backbone = keras_hub.models.Gemma4Backbone(**config)
    vision_backbones.copy_text_weights(text_lm.backbone, backbone)
    return keras_hub.models.Gemma4CausalLM(
        backbone=backbone, preprocessor=preprocessor or text_lm.preprocessor
    )


def with_image_preprocessor(
    text_lm, max_images_per_prompt=2, bidirectional=True
):
    """`text_lm` with a vision encoder and KerasHub's Gemma 4 preprocessor
    (which needs TensorFlow) taking images (the presets' rescale to
    [-1, 1])."""
    import keras_hub

    converter = keras_hub.layers.Gemma4ImageConverter(
        patch_size=PATCH_SIZE, max_soft_tokens=MAX_SOFT_TOKENS,
        pooling_kernel_size=POOLING, scale=1 / 127.5, offset=-1.0,
    )
    preprocessor = keras_hub.models.Gemma4CausalLMPreprocessor(
        tokenizer=text_lm.preprocessor.tokenizer,
        image_converter=converter,
        num_vision_tokens_per_image=TOKENS_PER_IMAGE,
        max_images_per_prompt=max_images_per_prompt,
        sequence_length=text_lm.preprocessor.sequence_length,
    )
    return with_vision_encoder(text_lm, preprocessor, bidirectional)
