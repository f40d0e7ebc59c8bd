"""Requests an artifact cannot serve, refused before they reach vLLM.

A keras-vllm artifact serves text (`manifest.modalities.served`), and
since format 1.10 images when its family says how they enter the model
(`modalities.image`). An older export of a vision model serves its text
decoder only: vLLM would send an image to a model class that takes none
and fail inside the engine, so a request that carries one is refused here,
by name. For an artifact that serves images, a prompt must hold one image
marker per image (KerasHub's preprocessor puts each image at its marker).
"""

from keras_vllm import format as fmt
from keras_vllm.errors import RequestError
from keras_vllm.serve.frontend import chat_parts


def check_request(method, inputs, manifest):
    """Raises `ServingError` when `generate`'s prompts or `chat`'s messages
    carry inputs the artifact does not serve (an image for a text-only
    artifact), or a prompt's image markers and images disagree."""
    served = fmt.served_modalities(manifest)
    if "image" in served:
        _check_image_prompts(method, inputs, fmt.image_settings(manifest))
        return
    found = _non_text(method, inputs)
    if found is None:
        return
    unserved = fmt.unserved_inputs(manifest)
    note = (
        f" (the model's {', '.join(unserved)} inputs were exported for "
        "Keras-side use; its text decoder is served)" if unserved else ""
    )
    raise RequestError(
        f"The request carries {found}, but this artifact serves "
        f"{' and '.join(served)} only{note}. Send text prompts only."
    )


def _non_text(method, inputs):
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    if method == "generate":
        for prompt in items:
            if isinstance(prompt, dict) and prompt.get("multi_modal_data"):
                return "multi_modal_data " + ", ".join(
                    sorted(prompt["multi_modal_data"])
                )
        return None
    conversations = items if items and isinstance(items[0], list) else [items]
    for conversation in conversations:
        for kind, _ in chat_parts.non_text_parts(conversation):
            return f"a '{kind}' message part"
    return None


def _check_image_prompts(method, inputs, settings):
    if method != "generate":
        return
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    marker = settings["marker"]
    for prompt in items:
        if not isinstance(prompt, dict):
            continue
        data = prompt.get("multi_modal_data") or {}
        other = sorted(set(data) - {"image"})
        if other:
            raise RequestError(
                f"The request carries multi_modal_data {', '.join(other)}, "
                "but this artifact serves text and image only."
            )
        text = prompt.get("prompt")
        if not isinstance(text, str):
            continue
        images = data.get("image")
        count = 0 if images is None else (
            len(images) if isinstance(images, (list, tuple)) else 1
        )
        markers = text.count(marker)
        if markers != count:
            raise RequestError(
                f"The prompt holds {markers} image marker(s) '{marker}' but "
                f"the request carries {count} image(s). Put one '{marker}' "
                "in the prompt where each image goes, as the model's "
                "preprocessor expects."
            )
