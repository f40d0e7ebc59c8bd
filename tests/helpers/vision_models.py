"""Tiny Gemma 3 vision-language models built from the trained text fixture.

`with_vision_encoder` adds a (random) tiny `Gemma3VisionEncoder` to the
trained tiny Gemma 3: its decoder weights are the trained ones.
`with_image_preprocessor` gives it KerasHub's `Gemma3CausalLMPreprocessor`
with a tiny image converter (16 x 16 pixels, 4 placeholder tokens per
image), as the vision presets ship (896 x 896, 256 tokens).
"""

import numpy as np

from helpers import vision_backbones

# The tiny encoder: 16 x 16 images in 4 x 4 patches, pooled by 2 -> 4 tokens.
IMAGE_SIZE = 16
TOKENS_PER_IMAGE = 4


def with_vision_encoder(text_lm, preprocessor=None, seed=0):
    """`text_lm` (a Gemma 3 `CausalLM`) with a tiny vision encoder added.

    The encoder is named as in keras-hub's presets (an auto-numbered name
    differs between two models built in one process, and an update keeps
    the served config).
    """
    import keras
    import keras_hub
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import (
        Gemma3VisionEncoder,
    )

    # The encoder's weights are random: seeded, so that every process
    # builds the same model whatever ran before it (a test comparing
    # two references on it must not depend on test order).
    keras.utils.set_random_seed(seed)
    config = text_lm.backbone.get_config()
    config["vision_encoder"] = Gemma3VisionEncoder(
        image_size=IMAGE_SIZE, patch_size=4, num_heads=2, hidden_dim=16,
        num_layers=1, intermediate_dim=32, output_dim=config["hidden_dim"],
        pool_size=2, name="gemma3_vision_encoder",
    )
    config["image_size"] = IMAGE_SIZE
    backbone = keras_hub.models.Gemma3Backbone(**config)
    vision_backbones.copy_text_weights(text_lm.backbone, backbone)
    return keras_hub.models.Gemma3CausalLM(
        backbone=backbone, preprocessor=preprocessor or text_lm.preprocessor
    )


def with_image_preprocessor(text_lm, max_images_per_prompt=2):
    """`text_lm` with a vision encoder and KerasHub's Gemma 3 preprocessor
    (which needs TensorFlow) taking images through a tiny image converter
    (the presets' rescale to [-1, 1])."""
    import keras_hub

    converter = keras_hub.layers.Gemma3ImageConverter(
        image_size=(IMAGE_SIZE, IMAGE_SIZE), scale=1 / 127.5, offset=-1.0,
    )
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(
        tokenizer=text_lm.preprocessor.tokenizer,
        image_converter=converter,
        num_vision_tokens_per_image=TOKENS_PER_IMAGE,
        max_images_per_prompt=max_images_per_prompt,
        sequence_length=text_lm.preprocessor.sequence_length,
    )
    return with_vision_encoder(text_lm, preprocessor)


def images(count, seed=0, sizes=((20, 24), (16, 16), (40, 12), (9, 30))):
    """`count` random RGB images (uint8 values as float32), of the sizes
    in turn: the converter resizes and crops each."""
    rng = np.random.RandomState(seed)
    return [
        rng.randint(0, 256, sizes[i % len(sizes)] + (3,)).astype("float32")
        for i in range(count)
    ]


def keras_greedy(causal_lm, prompt, images, new_tokens, length=128):
    """`generate()` on one image prompt: `(prompt ids, new token ids)`.

    The preprocessed inputs (markers expanded, images converted) go
    straight into the model's generate step, with no stop token, so the
    first `new_tokens` ids are greedy decoding's.
    """
    x = causal_lm.preprocessor.generate_preprocess(
        {"prompts": [prompt], "images": [images] if images else None},
        sequence_length=length,
    )
    prompt_ids = np.asarray(x["token_ids"])[0][np.asarray(x["padding_mask"])[0]]
    preprocessor = causal_lm.preprocessor
    causal_lm.preprocessor = None
    try:
        out = causal_lm.generate(x, stop_token_ids=None)
    finally:
        causal_lm.preprocessor = preprocessor
    ids = np.asarray(out["token_ids"])[0]
    start = len(prompt_ids)
    return prompt_ids.tolist(), ids[start:start + new_tokens].tolist()


def png_bytes(image):
    """One of `images()`'s arrays as PNG bytes (lossless: the same pixels
    reach a server that decodes it)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image).astype("uint8")).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(image):
    """An OpenAI `image_url` part's URL for an image: base64 PNG."""
    import base64

    return "data:image/png;base64," + base64.b64encode(
        png_bytes(image)
    ).decode("ascii")
