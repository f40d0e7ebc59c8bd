"""Gemma 4 images over OpenAI chat completions: `keras-vllm serve` on the
trained tiny Gemma 4 (dense, 31B-like) vision fixture of
`test_serving_images.py`, used through the `openai` client.

The export stores the chat template keras-vllm registers for Gemma 4's
instruction-tuned presets (`GEMMA4_CHAT_TEMPLATE`; the fixture is not built
from a preset, so it is passed), which writes each image part as
`<|image|>` where it stands. Greedy tokens equal greedy
decoding by the Keras forward pass on the rendered prompt and images
(KerasHub 0.32's Gemma 4 `generate()` attends causally within an image,
its forward pass both ways: `test_serving_images.py`). Gemma 3 over HTTP,
and the refusals (which do not depend on the family):
`test_serving_images_http.py`.
"""

import json
import sys

import pytest

pytest.importorskip("tpu_inference")
pytest.importorskip("tensorflow")  # Gemma4CausalLMPreprocessor needs it.
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.serving

from helpers import gemma4_vision_models  # noqa: E402
from helpers import vision_models  # noqa: E402
from helpers.http_server import running_server  # noqa: E402
from helpers.trained_models import trained  # noqa: E402

NEW_TOKENS = 8
MARKER = gemma4_vision_models.MARKER


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from keras_vllm.layers.gemma4 import GEMMA4_CHAT_TEMPLATE

    root = tmp_path_factory.mktemp("gemma4_images_http")
    model = gemma4_vision_models.with_image_preprocessor(
        trained("gemma4", enable_moe_block=False, num_layers=7)
    )
    path = str(model.export_vllm(
        root / "artifact", max_sequence_length=256,
        chat_template=GEMMA4_CHAT_TEMPLATE,
    ))
    command = [
        sys.executable, "-m", "keras_vllm.cli", "serve", path,
        "--limit-mm-per-prompt", json.dumps({"image": 2}),
        "--max-model-len", "64", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "64",
    ]
    with running_server(command, root / "server.log", timeout=500) as url:
        client = openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0
        )
        yield {"model": model, "path": path, "client": client}


def _images(seed, count, size):
    # One size a prompt: KerasHub zero-pads a prompt's images to the
    # largest before converting, keras-vllm converts each alone.
    return vision_models.images(count, seed=seed, sizes=(size,))


def _check_equals_forward_greedy(served, content, prompt, images):
    """The chat request's prompt ids and greedy tokens == Keras' greedy
    tokens on `prompt` (Gemma 4's chat format, which the preprocessor
    starts with its start token) and `images`, as golden image outputs are
    recorded (`greedy_with_images`: for Gemma 4, by the forward pass)."""
    from keras_vllm.hub import golden_images

    response = served["client"].chat.completions.create(
        model=served["path"],
        messages=[{"role": "user", "content": content}],
        max_tokens=NEW_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    want_prompt, want = golden_images.greedy_with_images(
        served["model"], [(prompt, images)], NEW_TOKENS, None, 64
    )[0]
    assert response.prompt_token_ids == want_prompt
    assert response.choices[0].token_ids == want
    return want


def _image_part(image):
    return {"type": "image_url",
            "image_url": {"url": vision_models.data_url(image)}}


def test_chat_with_images_equals_the_forward_pass(served):
    from keras_vllm.layers.common.image_inputs import image_model

    # Gemma 4's Keras reference is greedy decoding by the forward pass.
    assert not image_model(type(served["model"].backbone)).generate_is_exact
    # One square image between two text parts; another image, the same
    # text: another continuation.
    continuations = []
    for seed in (1, 106):
        image = _images(seed, 1, (16, 16))
        continuations.append(_check_equals_forward_greedy(
            served,
            [{"type": "text", "text": "look at"}, _image_part(image[0]),
             {"type": "text", "text": "now"}],
            f"<|turn>user\nlook at{MARKER}now<turn|>\n<|turn>model\n",
            image,
        ))
    assert continuations[0] != continuations[1]
    # Two wide images in one message, in the order given.
    pair = _images(2, 2, (40, 12))
    _check_equals_forward_greedy(
        served,
        [_image_part(pair[0]), {"type": "text", "text": "and"},
         _image_part(pair[1]), {"type": "text", "text": "are"}],
        f"<|turn>user\n{MARKER}and{MARKER}are<turn|>\n<|turn>model\n",
        pair,
    )
