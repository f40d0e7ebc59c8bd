"""A Qwen 3.5 `CausalLM` that carries a vision encoder (every Qwen 3.5
preset in KerasHub 0.32) exports whole and serves its text decoder: text
prompts exactly, requests with an image or a video refused by name (one
engine for the module; the Keras-side checks of the export and of the
decoder it serves, for Qwen 3.5 MoE too, are in
`tests/export/test_qwen3_5_vision_export.py`)."""

import numpy as np
import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import keras_vllm  # noqa: E402
from helpers import family_serving  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers.qwen3_5_vision import with_vision_encoder  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402

VISION_INPUTS = ["image_grid_thw", "pixel_values", "vision_indices"]


class _ForwardWithoutImages:
    """The vision model's own forward pass on a text prompt: no image."""

    def __init__(self, causal_lm):
        self.causal_lm = causal_lm
        self.preprocessor = causal_lm.preprocessor

    def __call__(self, inputs):
        rows = inputs["token_ids"].shape[0]
        return self.causal_lm(
            {
                **inputs,
                "pixel_values": np.zeros((rows, 0, 2, 4, 4, 3), "float32"),
                "image_grid_thw": np.zeros((rows, 0, 3), "int32"),
                "vision_indices": np.zeros((rows, 0), "int32"),
            }
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    text_model = trained("qwen3_5")
    model = with_vision_encoder(text_model)
    engine = serving_checks.start_engine(
        model,
        tmp_path_factory.mktemp("qwen3_5_vision") / "artifact",
        **family_serving.ENGINE_KWARGS["qwen3_5"],
    )
    yield text_model, model, engine
    serving_checks.shutdown(engine)


def test_the_artifact_says_it_serves_text_only(served):
    _, _, engine = served
    manifest = fmt.open_artifact(engine.path).manifest
    assert manifest["modalities"] == {
        "served": ["text"], "unserved_inputs": VISION_INPUTS,
    }


def test_greedy_matches_greedy_by_the_forward_pass(served):
    """Qwen 3.5's reference is greedy decoding by the forward pass (its
    cached `generate()` is not that forward pass). The compiled reference
    runs the text model the vision model was built from: its decoder
    weights are the vision model's, and its logits on text equal the
    vision model's (`test_qwen3_5_vision_export.py`; the prompt logprobs
    below are checked against the vision model itself)."""
    text_model, _, engine = served
    serving_checks.check_greedy_matches_generate(
        engine, text_model, greedy=reference.greedy_by_forward_pass
    )


def test_prompt_logprobs_match_the_forward_pass_without_images(served):
    _, model, engine = served
    serving_checks.check_prompt_logprobs(engine, _ForwardWithoutImages(model))


@pytest.mark.parametrize(
    "data",
    [
        {"image": np.zeros((16, 16, 3), "uint8")},
        {"video": np.zeros((2, 16, 16, 3), "uint8")},
    ],
    ids=["image", "video"],
)
def test_image_and_video_requests_are_refused_by_name(served, data):
    _, _, engine = served
    kind = next(iter(data))
    with pytest.raises(
        keras_vllm.ServingError, match=f"multi_modal_data {kind}.*text only"
    ):
        engine.generate([{"prompt": "the", "multi_modal_data": data}])
    # The engine still serves.
    assert engine.generate(["the"])[0].outputs[0].token_ids
