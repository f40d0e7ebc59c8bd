"""`manifest.modalities.image` (format 1.9): how the exported model takes
images.

An export of a vision-language `CausalLM` whose family registers image
inputs (`keras_vllm.layers.common.image_inputs`) records, as plain JSON,
what KerasHub's preprocessor does with an image and its prompt marker: the
image converter's resize and rescale, how many placeholder tokens stand for
one image and the text they are expanded from, the placeholder's token id,
and how placeholders attend to each other. A vLLM multimodal processor
rebuilds the same pixels and token ids from it (`keras_vllm.hub.images`),
with no Hugging Face processor files and nothing executed from the
artifact. The encoder's own settings are in the stored backbone config.

Two kinds of converter (`converter.kind`): `"resize"` (format 1.9, the
default when absent: KerasHub's `ImageConverter`, every image resized to one
`image_size`) and `"patches"` (format 1.11: variable resolution, as
`Gemma4ImageConverter`: each image resized keeping its aspect ratio to at
most `max_soft_tokens * pooling_kernel_size**2` patches of `patch_size`
pixels, then flattened into patches with their (x, y) positions).
"""

from keras_vllm.format.checks import invalid_unless as _expect
from keras_vllm.format.checks import field as _field
from keras_vllm.format.checks import is_int
from keras_vllm.format.checks import is_number

# How placeholders attend to each other in the Keras model (a copy of
# `keras_vllm.layers.common.image_inputs.IMAGE_ATTENTION`: the format layer
# imports no model code).
IMAGE_ATTENTION = ("causal", "bidirectional_within_image")
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "lanczos3", "lanczos5",
                  "area")
CONVERTER_KINDS = ("resize", "patches")
_MAX_SIDE = 16384
_MAX_TOKENS = 65536


def image_settings(manifest):
    """The artifact's image settings (`modalities.image`), or None (format
    1.8 and older, and models that take no image)."""
    return manifest.get("modalities", {}).get("image")


def validate(modalities, version):
    """Checks `modalities.image` of a manifest declaring `version`.

    Raises:
        ArtifactError: when the field is malformed or the declared version
            is older than 1.9.
    """
    if "image" not in modalities:
        return
    _expect(
        tuple(version) >= (1, 9),
        "'modalities.image' is a format 1.9 field, but the artifact "
        f"declares {version[0]}.{version[1]}.",
    )
    image = _field(modalities, "image", dict, "modalities")
    where = "modalities.image"
    converter = _field(image, "converter", dict, where)
    kind = converter.get("kind", "resize")
    _expect(
        kind in CONVERTER_KINDS,
        f"'{where}.converter.kind' must be one of {CONVERTER_KINDS}.",
    )
    if kind == "patches":
        _expect(
            tuple(version) >= (1, 11),
            "'modalities.image.converter.kind' is a format 1.11 field, but "
            f"the artifact declares {version[0]}.{version[1]}.",
        )
        _validate_patches(converter, f"{where}.converter")
    else:
        _validate_resize(converter, f"{where}.converter")
    _expect(
        _int_in(image.get("encoder_image_size"), 1, _MAX_SIDE),
        f"'{where}.encoder_image_size' must be a positive int.",
    )
    _expect(
        _int_in(image.get("tokens_per_image"), 1, _MAX_TOKENS),
        f"'{where}.tokens_per_image' must be a positive int.",
    )
    _expect(
        _int_in(image.get("max_images_per_prompt"), 1, 1024),
        f"'{where}.max_images_per_prompt' must be a positive int.",
    )
    _expect(
        _int_in(image.get("placeholder_token_id"), 0, 2**31 - 1),
        f"'{where}.placeholder_token_id' must be a token id.",
    )
    marker = _field(image, "marker", str, where)
    _expect(0 < len(marker) < 200, f"'{where}.marker' must be a short text.")
    expansion = _field(image, "expansion", dict, where)
    for key in ("before", "placeholder", "after"):
        text = _field(expansion, key, str, f"{where}.expansion")
        _expect(len(text) < 200, f"'{where}.expansion.{key}' is too long.")
    _expect(
        expansion["placeholder"] != "",
        f"'{where}.expansion.placeholder' must not be empty.",
    )
    _expect(
        image.get("attention") in IMAGE_ATTENTION,
        f"'{where}.attention' must be one of {IMAGE_ATTENTION}.",
    )


def _validate_scale(converter, where):
    for key in ("scale", "offset"):
        value = converter.get(key)
        values = value if isinstance(value, list) else [value]
        _expect(
            value is None or (
                len(values) in (1, 3)
                and all(is_number(v) for v in values)
            ),
            f"'{where}.{key}' must be null, a number or 3 numbers.",
        )


def _validate_resize(converter, where):
    size = _field(converter, "image_size", list, where)
    _expect(
        len(size) == 2 and all(_int_in(n, 1, _MAX_SIDE) for n in size),
        f"'{where}.image_size' must be [height, width].",
    )
    _validate_scale(converter, where)
    _expect(
        converter.get("interpolation") in INTERPOLATIONS,
        f"'{where}.interpolation' must be one of {INTERPOLATIONS}.",
    )
    for key in ("antialias", "crop_to_aspect_ratio", "pad_to_aspect_ratio"):
        _field(converter, key, bool, where)


def _validate_patches(converter, where):
    for key, high in (
        ("patch_size", 1024), ("max_soft_tokens", _MAX_TOKENS),
        ("pooling_kernel_size", 64),
    ):
        _expect(
            _int_in(converter.get(key), 1, high),
            f"'{where}.{key}' must be a positive int.",
        )
    _validate_scale(converter, where)


def _int_in(value, low, high):
    return is_int(value) and low <= value <= high
