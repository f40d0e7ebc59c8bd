"""Requests an artifact cannot serve, refused before they reach vLLM.

A keras-vllm artifact serves text (`manifest.modalities.served`): a model
exported with a vision encoder serves its text decoder only. vLLM would
send an image to a model class that takes none and fail inside the
engine, so a request that carries one is refused here, by name.
"""

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError

# Content parts of vLLM's chat messages that are not text.
_NON_TEXT_PARTS = ("image", "image_url", "image_pil", "image_embeds",
                   "audio", "audio_url", "input_audio", "video", "video_url")


def check_request(method, inputs, manifest):
    """Raises `ServingError` when `generate`'s prompts or `chat`'s messages
    carry inputs other than text (the artifact serves text only)."""
    served = fmt.served_modalities(manifest)
    found = _non_text(method, inputs)
    if found is None:
        return
    unserved = fmt.unserved_inputs(manifest)
    note = (
        f" (the model's {', '.join(unserved)} inputs were exported for "
        "Keras-side use; its text decoder is served)" if unserved else ""
    )
    raise ServingError(
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
        for message in conversation:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in _NON_TEXT_PARTS:
                    return f"a '{kind}' message part"
    return None
