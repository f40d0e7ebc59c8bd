"""Chat content parts checked against what an artifact serves
(`serve/frontend/chat_parts.py`), and Gemma 3's chat template placing image
parts (no engine: the served path is `test_serving_images_http.py`)."""

import binascii

import pytest

from keras_vllm.errors import RequestError
from keras_vllm.serve.frontend import chat_parts

SETTINGS = {"max_images_per_prompt": 3, "marker": "<start_of_image>"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
TEXT = {"type": "text", "text": "hi"}


def _user(*parts):
    return [{"role": "user", "content": list(parts)}]


def test_text_and_images_within_the_limits_pass():
    chat_parts.check_messages(
        _user(TEXT, IMAGE, IMAGE), ["text", "image"], SETTINGS, image_limit=2
    )
    chat_parts.check_messages(
        [{"role": "user", "content": "plain text"}], ["text"], None
    )
    # The part's key alone (no `type`) is an image, as vLLM reads it.
    chat_parts.check_messages(
        _user({"image_url": {"url": "data:,"}}), ["text", "image"], SETTINGS
    )


def test_an_image_for_a_text_only_artifact_names_the_fix():
    with pytest.raises(RequestError, match="serves text only") as raised:
        chat_parts.check_messages(_user(TEXT, IMAGE), ["text"], None)
    assert isinstance(raised.value, ValueError)  # vLLM's server: 400
    assert "image converter" in str(raised.value)


@pytest.mark.parametrize("part", [
    {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
    {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,AA"}},
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA"}},
    {"type": "image_embeds", "image_embeds": "AA"},
])
def test_audio_video_and_embeddings_are_refused_by_name(part):
    with pytest.raises(RequestError, match="text and images only") as raised:
        chat_parts.check_messages(_user(part), ["text", "image"], SETTINGS)
    assert part["type"] in str(raised.value)


def test_too_many_images_name_the_limit_that_applies():
    with pytest.raises(RequestError) as raised:
        chat_parts.check_messages(
            _user(*[IMAGE] * 3), ["text", "image"], SETTINGS, image_limit=2
        )
    assert "at most 2" in str(raised.value)
    assert "--limit-mm-per-prompt '{\"image\": 3}'" in str(raised.value)
    with pytest.raises(RequestError) as raised:
        chat_parts.check_messages(
            _user(*[IMAGE] * 4), ["text", "image"], SETTINGS, image_limit=999
        )
    assert "at most 3" in str(raised.value)
    assert "max_images_per_prompt" in str(raised.value)
    # Images count over the whole conversation, as vLLM's tracker counts.
    with pytest.raises(RequestError, match="4 images"):
        chat_parts.check_messages(
            _user(IMAGE, IMAGE) + _user(IMAGE, IMAGE),
            ["text", "image"], SETTINGS,
        )


def test_a_file_url_needs_allowed_local_media_path():
    part = {"type": "image_url", "image_url": {"url": "file:///tmp/a.png"}}
    with pytest.raises(RequestError, match="--allowed-local-media-path"):
        chat_parts.check_messages(
            _user(part), ["text", "image"], SETTINGS, local_media=False
        )
    chat_parts.check_messages(
        _user(part), ["text", "image"], SETTINGS, local_media=True
    )


def test_unreadable_image_errors_are_named():
    from PIL import UnidentifiedImageError

    try:
        try:
            raise UnidentifiedImageError("cannot identify image file")
        except OSError as e:
            raise ValueError(f"Failed to load image: {e}") from e
    except ValueError as error:
        named = chat_parts.unreadable_image(error)
    assert isinstance(named, RequestError)
    assert "could not be read" in str(named)
    assert "data:image/png;base64," in str(named)
    assert chat_parts.unreadable_image(binascii.Error("bad padding"))
    assert chat_parts.unreadable_image(ValueError("At most 2 image(s)")) is None


def test_gemma3_template_places_image_parts_and_keeps_text_rendering():
    from vllm.renderers.hf import _detect_content_format

    from keras_vllm.layers.gemma import GEMMA_CHAT_TEMPLATE
    from keras_vllm.layers.gemma3 import GEMMA3_CHAT_TEMPLATE
    from keras_vllm.serve.tokenizer import chat

    def render(template, messages):
        return chat.render(
            template, messages, path="artifact",
            add_generation_prompt=True, bos_token="<bos>",
        )

    text = [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": " hi "},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"},
    ]
    assert render(GEMMA3_CHAT_TEMPLATE, text) == render(
        GEMMA_CHAT_TEMPLATE, text
    )
    # vLLM hands this template content parts ("openai" format).
    assert _detect_content_format(
        GEMMA3_CHAT_TEMPLATE, default="string"
    ) == "openai"
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Compare "}, {"type": "image"},
            {"type": "text", "text": " with"}, {"type": "image"},
        ]},
    ]
    assert render(GEMMA3_CHAT_TEMPLATE, parts) == (
        "<bos><start_of_turn>user\nBe brief.\n\nCompare<start_of_image>with"
        "<start_of_image><end_of_turn>\n<start_of_turn>model\n"
    )


def test_gemma4_template_writes_turns_and_places_image_parts():
    from vllm.renderers.hf import _detect_content_format

    from keras_vllm.layers.gemma4 import GEMMA4_CHAT_TEMPLATE
    from keras_vllm.serve.tokenizer import chat

    def render(messages, add_generation_prompt=True):
        return chat.render(
            GEMMA4_CHAT_TEMPLATE, messages, path="artifact",
            add_generation_prompt=add_generation_prompt, bos_token="<bos>",
        )

    text = [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": " hi "},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"},
    ]
    assert render(text) == (
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nhi<turn|>\n"
        "<|turn>model\nyo<turn|>\n<|turn>user\nagain<turn|>\n"
        "<|turn>model\n"
    )
    assert render(text, add_generation_prompt=False).endswith(
        "again<turn|>\n"
    )
    # vLLM hands this template content parts ("openai" format); text parts
    # render as string content does.
    assert _detect_content_format(
        GEMMA4_CHAT_TEMPLATE, default="string"
    ) == "openai"
    as_parts = [
        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
        for m in text
    ]
    assert render(as_parts) == render(text)
    parts = [{"role": "user", "content": [
        {"type": "text", "text": "Compare "}, {"type": "image"},
        {"type": "text", "text": " with"}, {"type": "image"},
    ]}]
    assert render(parts) == (
        "<bos><|turn>user\nCompare<|image|>with<|image|><turn|>\n"
        "<|turn>model\n"
    )
