"""Gemma 4's image settings and backbone split where images enter it
(`layers/gemma4_images.py`): the artifact's converter settings rebuild the
preprocessor's patches (`hub/images.py::image_model_inputs`), and logits
from the split (one image per encoder call, merged embeddings, decoder)
equal the whole Keras model's forward pass with images, for the dense
model and for an E2B-like one (per-layer embeddings fed from the token ids,
KV-shared layers, causal images) (Keras-side only, no engine)."""

import numpy as np
import pytest

from keras_vllm.hub import images as image_io
from keras_vllm.layers import families  # noqa: F401
from keras_vllm.layers.common import image_inputs
from helpers import gemma4_vision_models as g4
from helpers import vision_models
from helpers.trained_models import trained

pytest.importorskip("tensorflow")  # Gemma4CausalLMPreprocessor needs it.


@pytest.fixture(scope="module")
def model():
    # The engine test's model (one fine-tune per session for both).
    return g4.with_image_preprocessor(
        trained("gemma4", enable_moe_block=False, num_layers=7)
    )


@pytest.fixture(scope="module")
def e2b_model():
    # The engine test's E2B-like model: causal images, as the E2B / E4B
    # presets.
    return g4.with_image_preprocessor(
        trained("gemma4_e2b"), bidirectional=False
    )


def _preprocess(model, prompt, images, length=40):
    x = model.preprocessor.generate_preprocess(
        {"prompts": [prompt], "images": [images] if images else None},
        sequence_length=length,
    )
    # Without an audio encoder the backbone takes no audio inputs.
    names = set(model.backbone.input)
    return {k: np.asarray(v) for k, v in x.items() if k in names}


def test_settings_rebuild_the_preprocessors_patches(model):
    settings = image_inputs.image_settings(model)
    assert settings["converter"]["kind"] == "patches"
    assert settings["attention"] == "bidirectional_within_image"
    assert settings["marker"] == g4.MARKER
    # Square, wide and tall images: 4, 2 and 2 real soft tokens.
    for size in ((16, 16), (20, 40), (40, 12)):
        image = vision_models.images(1, seed=3, sizes=(size,))
        want = _preprocess(model, f"a {g4.MARKER}", image)
        got = image_io.image_model_inputs(settings, image)
        np.testing.assert_array_equal(
            got["pixel_position_ids"], want["pixel_position_ids"][0]
        )
        np.testing.assert_allclose(
            got["pixel_values"], want["pixel_values"][0], atol=1e-5
        )


@pytest.mark.parametrize("which", ["dense", "e2b"])
def test_logits_from_merged_embeddings_equal_the_forward_pass(
    which, request
):
    import jax.numpy as jnp

    model = request.getfixturevalue(
        {"dense": "model", "e2b": "e2b_model"}[which]
    )
    backbone = model.backbone
    parts = image_inputs.image_model(type(backbone))
    settings = image_inputs.image_settings(model)
    # Two wide images (2 real soft tokens each, 2 zero rows) in one prompt.
    cases = [
        (f"two {g4.MARKER} and {g4.MARKER} here",
         vision_models.images(2, seed=1, sizes=((20, 40),))),
    ]
    for prompt, images in cases:
        x = _preprocess(model, prompt, images)
        want = np.asarray(model(x))
        ids = x["token_ids"]
        placeholder = ids[0] == settings["placeholder_token_id"]
        assert placeholder.sum() == len(images) * settings["tokens_per_image"]
        text = parts.embed_tokens(backbone, ids)[0]
        rows = np.zeros((0, backbone.hidden_dim), "float32")
        if images:
            inputs = image_io.image_model_inputs(settings, images)
            rows = parts.embed_images(backbone, **inputs)
            rows = np.asarray(rows)[:, : settings["tokens_per_image"]]
            rows = rows.reshape(-1, backbone.hidden_dim)
        merged = image_inputs.merge_image_embeddings(
            jnp.asarray(text), jnp.asarray(rows), jnp.asarray(placeholder)
        )
        hidden = parts.decode(
            backbone, merged[None], x["padding_mask"], x["vision_mask"],
            token_ids=ids, image_mask=placeholder[None],
        )
        logits = np.asarray(backbone.token_embedding(hidden, reverse=True))
        np.testing.assert_allclose(logits, want, atol=1e-5)


def test_e2b_images_are_served_causal_and_refused_bidirectional(e2b_model):
    """E2B / E4B (per-layer embeddings, KV-shared layers) serve images with
    causal attention, as their presets; made bidirectional, a KV-shared
    layer would need the image-span kernel to read a cache it does not
    write, so the model then serves text only (no image settings)."""
    settings = image_inputs.image_settings(e2b_model)
    assert settings["attention"] == "causal"
    assert e2b_model.backbone.hidden_size_per_layer_input > 0
    bidirectional = g4.with_vision_encoder(
        e2b_model, e2b_model.preprocessor, bidirectional=True
    )
    assert image_inputs.image_settings(bidirectional) is None


def test_e2b_decode_needs_the_token_ids(e2b_model):
    backbone = e2b_model.backbone
    parts = image_inputs.image_model(type(backbone))
    x = np.zeros((1, 3, backbone.hidden_dim), "float32")
    ones = np.ones((1, 3), "int32")
    with pytest.raises(ValueError, match="token ids"):
        parts.decode(backbone, x, ones, ones * 0)


def test_patches_converter_is_a_format_1_11_field(model):
    import keras_vllm
    from keras_vllm.format.image_settings import validate

    settings = image_inputs.image_settings(model)
    validate({"image": settings}, (1, 11))
    with pytest.raises(keras_vllm.ArtifactError, match="format 1.11 field"):
        validate({"image": settings}, (1, 10))
    bad = dict(settings, converter=dict(settings["converter"], patch_size=0))
    with pytest.raises(keras_vllm.ArtifactError, match="patch_size"):
        validate({"image": bad}, (1, 11))
    bad = dict(settings, converter=dict(settings["converter"], kind="crop"))
    with pytest.raises(keras_vllm.ArtifactError, match="kind"):
        validate({"image": bad}, (1, 11))
