"""Tiny Qwen 3.5 vision-language models built from a text fixture.

KerasHub 0.32's Qwen 3.5 and Qwen 3.5 MoE presets carry a
`Qwen3_5VisionEncoder` (images and video). `with_vision_encoder` adds a
tiny random one to a (trained) tiny text model, keeping its decoder
weights, with the presets' M-RoPE section set, as the presets load.
"""

from helpers import vision_backbones

# The tiny rotary part is `HEAD_DIM * 0.25 = 4` channels: 2 frequency
# pairs, split over M-RoPE's temporal / height / width channels.
MROPE_SECTION = [1, 1, 0]


def with_vision_encoder(text_lm, seed=0):
    """`text_lm` (a Qwen 3.5 or Qwen 3.5 MoE `CausalLM`) with a tiny
    vision encoder added and its decoder variables copied over.

    The encoder gets Keras' auto-numbered name, as a preset's does:
    `Qwen3_5VisionEncoder.get_config()` keeps no `name`, so a rebuild from
    the artifact numbers it again (the loader's variable matcher allows
    that for auto-named layers).
    """
    import keras
    from keras_hub.src.models.qwen3_5.qwen3_5_vision_encoder import (
        Qwen3_5VisionEncoder,
    )

    # Seeded: every process builds the same random encoder.
    keras.utils.set_random_seed(seed)
    config = text_lm.backbone.get_config()
    config["vision_encoder"] = Qwen3_5VisionEncoder(
        depth=1, hidden_size=16, num_heads=2, intermediate_size=32,
        patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
        out_hidden_size=config["hidden_dim"], num_position_embeddings=16,
    )
    config["mrope_section"] = MROPE_SECTION
    backbone = type(text_lm.backbone)(**config)
    vision_backbones.copy_text_weights(text_lm.backbone, backbone)
    return type(text_lm)(backbone=backbone, preprocessor=text_lm.preprocessor)
