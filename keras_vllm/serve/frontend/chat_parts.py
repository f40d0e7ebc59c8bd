"""Chat messages' content parts checked against what the artifact serves.

OpenAI chat messages (`/v1/chat/completions`, `LLM.chat`,
`KerasVllmEngine.chat`) carry images as content parts (`image_url` with a
`data:` or `file:` URL, ...). vLLM parses them in its renderer
(`HfRenderer.render_messages`) and answers what goes wrong there with
messages that name the problem but not what to do about it, or not at all:

- an image for a text-only artifact: "... is not a multimodal model";
- audio or video for an image artifact: a processor error deep in vLLM;
- more images than the model's preprocessor takes: "At most 2 image(s)
  may be provided in one prompt." (no word on where the limit comes from);
- bytes that are not an image: "Failed to load image: cannot identify
  image file <_io.BytesIO ...>";
- a `file:` URL without `--allowed-local-media-path`: a `RuntimeError`,
  which the OpenAI server answers with a 500.

So for a keras-vllm artifact the messages are checked here first, and an
image that cannot be read is reported by name: each as `RequestError`
(a `ValueError`: the server answers 400 and keeps serving; the engine
raises it). Requests to other models are left as vLLM handles them.

Patched: `HfRenderer.render_messages` and `render_messages_async` (vLLM
0.32.0), the renderer vLLM pairs with keras-vllm's tokenizer mode.
"""

import binascii

from keras_vllm import format as fmt
from keras_vllm import patching
from keras_vllm.errors import KerasVllmError
from keras_vllm.errors import RequestError

# The modality of each non-text content part type vLLM's chat parser takes.
PART_MODALITIES = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image embeddings",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio embeddings",
    "video_url": "video",
    "video_embeds": "video embeddings",
}
_IMAGE_PARTS = ("image_url", "input_image", "image_pil")

# `{artifact path: (served modalities, image settings)}`, read once.
_SERVED = {}


def part_type(part):
    """A content part's type: its `type`, or (as vLLM infers it) the one
    part key it carries; None for text and unknown parts."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind is None:
        kind = next((k for k in PART_MODALITIES if k in part), None)
    return kind if kind in PART_MODALITIES else None


def non_text_parts(messages):
    """`(type, part)` of each non-text content part of a conversation."""
    for message in messages or ():
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, (list, tuple)):
            continue
        for part in content:
            kind = part_type(part)
            if kind is not None:
                yield kind, part


def check_messages(
    messages, served, settings, image_limit=None, local_media=True
):
    """Raises `RequestError` for content parts the artifact cannot take.

    Example:

    ```python
    check_messages(
        [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {...}}]}],
        served=["text", "image"], settings=image_settings,
    )  # RequestError: ... serves text and images only ...
    ```

    Args:
        messages: one conversation (OpenAI chat messages).
        served: the artifact's `modalities.served`.
        settings: its `modalities.image` (None: it takes no image).
        image_limit: the server's `--limit-mm-per-prompt` for images (None:
            the model's own limit only).
        local_media: whether `file:` image URLs may be read
            (`--allowed-local-media-path` is set).
    """
    images = 0
    for kind, part in non_text_parts(messages):
        modality = PART_MODALITIES[kind]
        if "image" not in served:
            raise RequestError(
                f"The request carries a '{kind}' content part, but this "
                "model serves text only. Send text content only, or serve "
                "an export of the model with its image converter (format "
                "1.10 or later lists 'image' in modalities.served)."
            )
        if kind not in _IMAGE_PARTS:
            raise RequestError(
                f"The request carries a '{kind}' content part ({modality}), "
                "but this model serves text and images only. Send 'text' "
                "and 'image_url' parts (images as data: URLs, or file: URLs "
                "under --allowed-local-media-path)."
            )
        images += 1
        url = _url_of(part)
        if (
            isinstance(url, str) and url[:5].lower() == "file:"
            and not local_media
        ):
            raise RequestError(
                "The request sends an image as a file: URL, but this server "
                "reads no local files. Send the image inline as a "
                "data:image/png;base64,... URL, or start the server with "
                "--allowed-local-media-path DIR (files under DIR only)."
            )
    if not images:
        return
    most = int(settings["max_images_per_prompt"])
    if images > most:
        raise RequestError(
            f"The request carries {images} images, but this model takes at "
            f"most {most} per prompt (its preprocessor's "
            "max_images_per_prompt, fixed at export). Send at most "
            f"{most} images per request."
        )
    if image_limit is not None and images > image_limit:
        raise RequestError(
            f"The request carries {images} images, but this server takes at "
            f"most {image_limit} per prompt (--limit-mm-per-prompt). Send at "
            f"most {image_limit}, or start the server with "
            f"--limit-mm-per-prompt '{{\"image\": {images}}}' (the model "
            f"takes up to {most})."
        )


def _url_of(part):
    url = part.get("image_url") or part.get("input_image")
    return url.get("url") if isinstance(url, dict) else url


def unreadable_image(error):
    """The `RequestError` for `error`, raised while vLLM read a request's
    images, when it says an image's bytes could not be read (not base64,
    not an image format PIL knows, a file that cannot be opened); else
    None."""
    from PIL import UnidentifiedImageError

    seen = error
    while seen is not None:
        if isinstance(seen, (UnidentifiedImageError, binascii.Error, OSError)):
            return RequestError(
                f"An image of the request could not be read ({error}). Send "
                "the bytes of a PNG, JPEG, WebP or GIF image, base64-encoded "
                "in a data:image/png;base64,... URL (or a file: URL under "
                "--allowed-local-media-path)."
            )
        seen = seen.__cause__ or seen.__context__
    return None


def _served(model_config):
    path = str(model_config.model)
    if path not in _SERVED:
        # The manifest alone (validated): the engine verified the artifact
        # at start, and hashing its weights here would hold the server's
        # event loop.
        manifest = fmt.read_manifest(path)
        _SERVED[path] = (
            fmt.served_modalities(manifest), fmt.image_settings(manifest)
        )
    return _SERVED[path]


def _check(renderer, messages):
    """Checks `messages` when `renderer` serves a keras-vllm artifact;
    returns whether it does and they carry non-text parts."""
    from keras_vllm.serve.hf_config import serves_artifact

    model_config = renderer.model_config
    if not serves_artifact(model_config) or not any(non_text_parts(messages)):
        return False
    served, settings = _served(model_config)
    mm_config = model_config.multimodal_config
    limit = mm_config.get_limit_per_prompt("image") if mm_config else None
    check_messages(
        messages, served, settings, image_limit=limit,
        local_media=bool(model_config.allowed_local_media_path),
    )
    return True


def _reraise(error, checked):
    if checked and not isinstance(error, KerasVllmError):
        named = unreadable_image(error)
        if named is not None:
            raise named from error
    raise error


def install():
    """Makes vLLM's chat renderer check keras-vllm artifacts' requests
    (keras-vllm's vLLM plugin calls this in every vLLM process)."""
    from vllm.renderers.hf import HfRenderer

    def checking(original):
        def render_messages(self, messages, params):
            checked = _check(self, messages)
            try:
                return original(self, messages, params)
            except Exception as error:  # re-raised, named when an image
                _reraise(error, checked)

        return render_messages

    def checking_async(original):
        async def render_messages_async(self, messages, params):
            checked = _check(self, messages)
            try:
                return await original(self, messages, params)
            except Exception as error:  # re-raised, named when an image
                _reraise(error, checked)

        return render_messages_async

    patching.replace(HfRenderer, "render_messages", checking)
    patching.replace(HfRenderer, "render_messages_async", checking_async)
