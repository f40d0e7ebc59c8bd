"""KerasHub's image preprocessing rebuilt from an artifact's image settings.

A vision-language `CausalLM`'s preprocessor does two things with an image
prompt: it expands each marker in the text (Gemma 3: `<start_of_image>`)
into the run of placeholder tokens the encoder's embeddings replace, and
it resizes and rescales each image with its `ImageConverter`. A serving
front-end has the artifact, not the preprocessor object, so it redoes both
from `manifest.modalities.image` (`keras_vllm.format.image_settings`): the
text by the same string replacement, the pixels with a KerasHub
`ImageConverter` built from the stored settings, so the arrays equal the
ones `generate()` feeds the model.

Variable-resolution converters (`converter.kind == "patches"`, format 1.11:
Gemma 4's) give each image as patches with their positions instead of one
fixed-size array; `image_model_inputs` returns whatever arrays the
converter gives, named as the encoder takes them.
"""

import numpy as np

from keras_vllm.errors import ServingError


def expand_prompt(settings, text):
    """`text` with every image marker expanded as the preprocessor does.

    Example:

    ```python
    expand_prompt(settings, "what is <start_of_image>?")
    # "what is \n\n<start_of_image><img><img>...<end_of_image>\n\n?"
    ```
    """
    expansion = settings["expansion"]
    run = (
        expansion["before"]
        + expansion["placeholder"] * settings["tokens_per_image"]
        + expansion["after"]
    )
    return text.replace(settings["marker"], run)


def count_markers(settings, text):
    """How many images `text` asks for (its image markers)."""
    return text.count(settings["marker"])


def image_converter(settings):
    """A `keras_hub.layers.ImageConverter` doing what the exported
    preprocessor's converter does (always in float32, as KerasHub's vision
    converters compute)."""
    import keras_hub

    converter = settings["converter"]
    if converter.get("kind") == "patches":
        # KerasHub's one variable-resolution image converter.
        return keras_hub.layers.Gemma4ImageConverter(
            patch_size=converter["patch_size"],
            max_soft_tokens=converter["max_soft_tokens"],
            pooling_kernel_size=converter["pooling_kernel_size"],
            scale=converter["scale"],
            offset=converter["offset"],
        )
    return keras_hub.layers.ImageConverter(
        image_size=tuple(converter["image_size"]),
        scale=converter["scale"],
        offset=converter["offset"],
        interpolation=converter["interpolation"],
        antialias=converter["antialias"],
        crop_to_aspect_ratio=converter["crop_to_aspect_ratio"],
        pad_to_aspect_ratio=converter["pad_to_aspect_ratio"],
        dtype="float32",
    )


def preprocess_images(settings, images, converter=None):
    """The model's pixels for `images`: a float32 `(N, H, W, 3)` array.

    Args:
        settings: the artifact's `modalities.image`.
        images: a sequence of `(height, width, 3)` arrays (any size, values
            0-255 as decoded) or PIL images.
        converter: an `image_converter(settings)` to reuse, or None.
    """
    converter = converter or image_converter(settings)
    out = [
        np.asarray(converter(_as_array(image)), dtype="float32")
        for image in images
    ]
    height, width = settings["converter"]["image_size"]
    if not out:
        return np.zeros((0, height, width, 3), "float32")
    return np.stack(out)


def image_model_inputs(settings, images, converter=None):
    """The vision encoder's inputs for `images`, as `{name: array}` with
    one row per image: `{"pixel_values": (N, H, W, 3)}` for a resizing
    converter; for a `"patches"` converter `{"pixel_values": (N, P, 3 *
    patch_size**2), "pixel_position_ids": (N, P, 2)}` with `P =
    max_soft_tokens * pooling_kernel_size**2` (the patches past an image's
    own are zeros at position (-1, -1), as KerasHub pads them).

    Args: as `preprocess_images`.
    """
    settings_converter = settings["converter"]
    if settings_converter.get("kind") != "patches":
        return {"pixel_values": preprocess_images(settings, images, converter)}
    converter = converter or image_converter(settings)
    values, positions = [], []
    for image in images:
        # One image per call: each keeps its own size (KerasHub converts a
        # prompt's images together, zero-padded to the largest).
        out = converter(_as_array(image)[None])
        values.append(np.asarray(out["pixel_values"], "float32")[0])
        positions.append(np.asarray(out["pixel_position_ids"], "int32")[0])
    patch = settings_converter["patch_size"]
    count = settings_converter["max_soft_tokens"] * (
        settings_converter["pooling_kernel_size"] ** 2
    )
    if not values:
        return {
            "pixel_values": np.zeros((0, count, 3 * patch * patch), "float32"),
            "pixel_position_ids": np.zeros((0, count, 2), "int32"),
        }
    return {
        "pixel_values": np.stack(values),
        "pixel_position_ids": np.stack(positions),
    }


def _as_array(image):
    """An RGB float32 `(height, width, 3)` array of `image`."""
    if hasattr(image, "convert"):  # a PIL image
        image = image.convert("RGB")
    array = np.asarray(image, dtype="float32")
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ServingError(
            f"An image must be (height, width, 3) RGB; got shape "
            f"{array.shape}. Send an RGB image (a PIL image, or an array "
            "of height x width x 3 values)."
        )
    return array
