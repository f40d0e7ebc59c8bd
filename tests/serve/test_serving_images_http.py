"""Images over OpenAI chat completions: `keras-vllm serve` (which runs
`vllm serve ARTIFACT --disable-chunked-mm-input --no-enable-prefix-caching
...`) on the trained tiny Gemma 3 vision fixture of
`test_serving_images.py`, used through the `openai` client.

Image parts (base64 `data:` URLs, and a `file:` URL under
`--allowed-local-media-path`) are rendered by the artifact's chat template
where they stand, as the image marker the Keras preprocessor expands; the
greedy tokens equal `generate()` on the same rendered prompt and images.
Requests the model cannot take get a 400 that names the problem and the
fix, and the server keeps serving (one server for the module).
"""

import base64
import json
import sys

import pytest

pytest.importorskip("tpu_inference")
pytest.importorskip("tensorflow")  # Gemma3CausalLMPreprocessor needs it.
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.serving

from helpers import vision_models  # noqa: E402
from helpers.http_server import running_server  # noqa: E402
from helpers.trained_models import trained  # noqa: E402

NEW_TOKENS = 8
MARKER = "<start_of_image>"
# The model takes 3 images a prompt; the server allows 2.
MODEL_LIMIT = 3
SERVER_LIMIT = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from keras_vllm.layers.gemma3 import GEMMA3_CHAT_TEMPLATE

    root = tmp_path_factory.mktemp("gemma3_images_http")
    model = vision_models.with_image_preprocessor(
        trained("gemma3"), max_images_per_prompt=MODEL_LIMIT
    )
    path = str(model.export_vllm(
        root / "artifact", max_sequence_length=256,
        chat_template=GEMMA3_CHAT_TEMPLATE,
    ))
    media = root / "media"
    media.mkdir()
    command = [
        sys.executable, "-m", "keras_vllm.cli", "serve", path,
        "--limit-mm-per-prompt", json.dumps({"image": SERVER_LIMIT}),
        "--allowed-local-media-path", str(media),
        # Few compiled shapes: a request here is one prompt of < 40 tokens.
        "--max-model-len", "64", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "64",
    ]
    log = root / "server.log"
    with running_server(command, log, timeout=500) as url:
        client = openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0
        )
        yield {"model": model, "path": path, "client": client,
               "media": media, "log": log}


def _images(seed, count, size=(20, 24)):
    # One size a prompt: KerasHub zero-pads a prompt's images to the
    # largest before resizing, keras-vllm converts each alone.
    return vision_models.images(count, seed=seed, sizes=(size,))


def _chat(served, content, **extra):
    return served["client"].chat.completions.create(
        model=served["path"],
        messages=[{"role": "user", "content": content}],
        max_tokens=NEW_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True, **extra},
    )


def _image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def _check_equals_generate(served, content, prompt, images):
    """The chat request's prompt ids and greedy tokens == `generate()` on
    `prompt` (the template's rendering, as Gemma 3's chat format writes
    it; the preprocessor adds the start token) and `images`."""
    response = _chat(served, content)
    want_prompt, want = vision_models.keras_greedy(
        served["model"], prompt, images, NEW_TOKENS
    )
    assert response.prompt_token_ids == want_prompt
    assert response.choices[0].token_ids == want
    return want


def test_chat_with_images_equals_generate(served):
    images = _images(1, 1)
    first = _check_equals_generate(
        served,
        [{"type": "text", "text": "What is in "},
         _image_part(vision_models.data_url(images[0])),
         {"type": "text", "text": " this picture?"}],
        f"<start_of_turn>user\nWhat is in{MARKER}this picture?<end_of_turn>\n"
        "<start_of_turn>model\n",
        images,
    )
    # Two images in one message, in the order given.
    pair = _images(2, 2, size=(40, 12))
    _check_equals_generate(
        served,
        [_image_part(vision_models.data_url(pair[0])),
         {"type": "text", "text": "and"},
         _image_part(vision_models.data_url(pair[1])),
         {"type": "text", "text": "differ in"}],
        f"<start_of_turn>user\n{MARKER}and{MARKER}differ in<end_of_turn>\n"
        "<start_of_turn>model\n",
        pair,
    )
    # A local file (under --allowed-local-media-path): another image, so
    # another continuation of the same text.
    other = _images(3, 1)
    file = served["media"] / "other.png"
    file.write_bytes(vision_models.png_bytes(other[0]))
    second = _check_equals_generate(
        served,
        [{"type": "text", "text": "What is in "},
         _image_part(file.as_uri()),
         {"type": "text", "text": " this picture?"}],
        f"<start_of_turn>user\nWhat is in{MARKER}this picture?<end_of_turn>\n"
        "<start_of_turn>model\n",
        other,
    )
    assert first != second


def _refused(served, content, *needles):
    with pytest.raises(openai.BadRequestError) as raised:
        _chat(served, content)
    assert raised.value.status_code == 400
    message = raised.value.message
    for needle in needles:
        assert needle in message, message
    # The server still serves.
    assert _chat(served, "the").choices[0].token_ids


def test_bad_image_requests_get_400_naming_the_fix(served):
    url = vision_models.data_url(_images(4, 1)[0])
    # More than --limit-mm-per-prompt allows (the model takes 3).
    _refused(
        served, [_image_part(url)] * 3 + [{"type": "text", "text": "hi"}],
        "3 images", f"at most {SERVER_LIMIT}", "--limit-mm-per-prompt",
    )
    # More than the model takes.
    _refused(
        served, [_image_part(url)] * 4,
        "4 images", f"at most {MODEL_LIMIT}", "max_images_per_prompt",
    )
    # Bytes that are not an image.
    junk = "data:image/png;base64," + base64.b64encode(
        b"these bytes are not an image"
    ).decode("ascii")
    _refused(
        served, [_image_part(junk), {"type": "text", "text": "hi"}],
        "could not be read", "data:image/png;base64,",
    )
    # A file outside --allowed-local-media-path (vLLM's own check).
    outside = served["media"].parent / "outside.png"
    outside.write_bytes(vision_models.png_bytes(_images(5, 1)[0]))
    _refused(
        served, [_image_part(outside.as_uri())], "--allowed-local-media-path"
    )


def test_audio_and_video_parts_are_refused(served):
    audio = {"type": "input_audio",
             "input_audio": {"data": base64.b64encode(b"RIFF").decode(),
                             "format": "wav"}}
    _refused(served, [audio, {"type": "text", "text": "hi"}],
             "input_audio", "text and images only")
    video = {"type": "video_url",
             "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    _refused(served, [video], "video_url", "text and images only")
    # Each also one WARNING line in the server's log (issue 52).
    lines = [
        line for line in served["log"].read_text().splitlines()
        if "keras-vllm refused POST /v1/chat/completions (400): "
        "RequestError: " in line
    ]
    for part in ("input_audio", "video_url"):
        assert [line for line in lines if f"'{part}'" in line], lines


def test_the_server_runs_vllm_serve_with_the_image_flags(served):
    # `keras-vllm serve` prints the `vllm serve` command it runs.
    commands = [
        line.split() for line in served["log"].read_text().splitlines()
        if line.split()[:1] and line.split()[0].endswith("/vllm")
    ]
    assert commands, served["log"].read_text()[:2000]
    command = commands[0]
    assert command[1:3] == ["serve", served["path"]]
    for flag in ("--disable-chunked-mm-input", "--no-enable-prefix-caching",
                 "--limit-mm-per-prompt", "--allowed-local-media-path"):
        assert flag in command, command
