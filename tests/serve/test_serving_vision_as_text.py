"""A Gemma 3 `CausalLM` that carries a vision encoder (the non-`_text`
presets: Gemma 3 4B/12B/27B, MedGemma, TranslateGemma) exports whole and
serves its text decoder: text prompts exactly as `generate()`, requests
with an image refused by name (one engine for the module)."""

import numpy as np
import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import keras_vllm  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from helpers.vision_models import with_vision_encoder  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402

VISION_INPUTS = ["images", "vision_indices", "vision_mask"]


class _ForwardWithoutImages:
    """The vision model's own forward pass on a text prompt: no image."""

    def __init__(self, causal_lm):
        self.causal_lm = causal_lm
        self.preprocessor = causal_lm.preprocessor

    def __call__(self, inputs):
        ids = inputs["token_ids"]
        size = self.causal_lm.backbone.image_size
        return self.causal_lm(
            {
                **inputs,
                "images": np.zeros((ids.shape[0], 0, size, size, 3), "float32"),
                "vision_indices": np.zeros((ids.shape[0], 0), "int32"),
                "vision_mask": np.zeros_like(ids, dtype="int32"),
            }
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = with_vision_encoder(trained("gemma3"))
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp("gemma3_vision") / "artifact"
    )
    yield model, engine
    serving_checks.shutdown(engine)


def test_the_artifact_says_it_serves_text_only(served):
    _, engine = served
    manifest = fmt.open_artifact(engine.path).manifest
    assert manifest["format_version"] == list(fmt.FORMAT_VERSION)
    assert manifest["modalities"] == {
        "served": ["text"], "unserved_inputs": VISION_INPUTS,
    }
    # The whole model is stored: Keras gets its vision encoder back.
    loaded = keras_vllm.load_causal_lm(engine.path)
    assert loaded.backbone.vision_encoder is not None


def test_greedy_matches_generate(served):
    model, engine = served
    serving_checks.check_greedy_matches_generate(engine, model)


def test_prompt_logprobs_match_the_forward_pass_without_images(served):
    model, engine = served
    serving_checks.check_prompt_logprobs(engine, _ForwardWithoutImages(model))


def test_a_request_with_an_image_is_refused_by_name(served):
    _, engine = served
    image = np.zeros((16, 16, 3), "uint8")
    with pytest.raises(keras_vllm.ServingError, match="text only"):
        engine.generate(
            [{"prompt": "the", "multi_modal_data": {"image": image}}]
        )
    # The engine still serves.
    assert engine.generate(["the"])[0].outputs[0].token_ids


def test_weights_update_from_a_new_export_of_the_vision_model(
    served, tmp_path
):
    """`update_weights` takes the decoder of a new export (the served
    backbone is the text decoder; the artifact holds the whole model)."""
    from keras_vllm.hub import reference
    from keras_vllm import testing
    from vllm import SamplingParams

    model, engine = served
    other = with_vision_encoder(
        testing.build_tiny_causal_lm("gemma3", num_layers=6, seed=1)
    )
    path = other.export_vllm(
        tmp_path / "other", max_sequence_length=256, golden_prompts=()
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = testing.prompts()[0]
    ids = reference.prompt_token_ids(model, prompt)
    original = engine.path
    try:
        engine.update_weights(path)
        got = list(engine.generate([prompt], params)[0].outputs[0].token_ids)
        assert got == reference.greedy_continuation(other, ids, 8, [])
    finally:
        engine.update_weights(original)
    got = list(engine.generate([prompt], params)[0].outputs[0].token_ids)
    assert got == reference.greedy_continuation(model, ids, 8, [])
