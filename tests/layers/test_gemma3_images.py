"""Gemma 3's backbone split where images enter it
(`layers/gemma3.py::Gemma3Images`) and the generic pieces the served model
class uses with it (`layers/common/image_inputs.py`): merging image rows
into a flat token batch, and each token's attention limit for images that
attend to themselves both ways. Checked against the whole Keras model's
forward pass with images and against KerasHub's own attention mask
(Keras-side only, no engine)."""

import numpy as np
import pytest

from keras_vllm import testing
from keras_vllm.layers import families  # noqa: F401
from keras_vllm.layers.common import image_inputs
from helpers import vision_models

pytest.importorskip("tensorflow")  # Gemma3CausalLMPreprocessor needs it.


@pytest.fixture(scope="module")
def model():
    return vision_models.with_image_preprocessor(
        testing.build_tiny_causal_lm("gemma3")
    )


def test_logits_from_merged_embeddings_equal_the_forward_pass(model):
    import jax.numpy as jnp

    backbone = model.backbone
    parts = image_inputs.image_model(type(backbone))
    images = vision_models.images(3, seed=1)
    x = model.preprocessor.generate_preprocess(
        {
            "prompts": ["two <start_of_image> and <start_of_image> here",
                        "one <start_of_image>", "none at all"],
            "images": [images[:2], images[2:], []],
        },
        sequence_length=40,
    )
    x = {k: np.asarray(v) for k, v in x.items()}
    want = np.asarray(model(x))
    settings = image_inputs.image_settings(model)
    for row, count in enumerate((2, 1, 0)):
        ids = x["token_ids"][row : row + 1]
        placeholder = ids[0] == settings["placeholder_token_id"]
        assert placeholder.sum() == count * settings["tokens_per_image"]
        text = parts.embed_tokens(backbone, ids)[0]
        rows = np.zeros((0, backbone.hidden_dim), "float32")
        if count:
            rows = parts.embed_images(backbone, x["images"][row, :count])
            rows = np.asarray(rows).reshape(-1, backbone.hidden_dim)
        merged = image_inputs.merge_image_embeddings(
            jnp.asarray(text), jnp.asarray(rows), jnp.asarray(placeholder)
        )
        hidden = parts.decode(
            backbone, merged[None], x["padding_mask"][row : row + 1],
            x["vision_mask"][row : row + 1],
        )
        logits = np.asarray(backbone.token_embedding(hidden, reverse=True))
        np.testing.assert_allclose(logits, want[row : row + 1], atol=1e-5)


def test_span_limits_give_kerashubs_attention_mask(model):
    import jax.numpy as jnp

    layer = model.backbone.transformer_layers[0]
    # Two sequences in one flat batch; runs of placeholders (1) in both,
    # one run touching the boundary between them.
    first = np.array([0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1])
    second = np.array([1, 1, 0, 1, 0, 0, 1, 1, 1])
    flat = np.concatenate([first, second]).astype(bool)
    positions = np.concatenate([np.arange(len(first)),
                                np.arange(len(second))])
    sequence_ids = np.repeat([0, 1], [len(first), len(second)])
    until = np.asarray(image_inputs.image_span_limits(
        jnp.asarray(flat), jnp.asarray(positions), jnp.asarray(sequence_ids)
    ))
    start = 0
    for mask in (first, second):
        n = len(mask)
        keras_mask = np.asarray(layer._compute_attention_mask(
            np.zeros((1, n, 4), "float32"), np.ones((1, n), "int32"),
            mask[None].astype(bool), None, 0,
        ))[0]
        limits = until[start : start + n]
        ours = np.arange(n)[None, :] <= limits[:, None]
        np.testing.assert_array_equal(ours, keras_mask.astype(bool))
        start += n
