"""The chat template an export stores.

An instruction-tuned Hugging Face checkpoint carries its chat template
(`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`), and
keras-hub's converter leaves it behind: a model fine-tuned from
`hf://meta-llama/Llama-3.2-1B-Instruct` would export without one, and
`/v1/chat/completions` would refuse every request. So an export whose
model came from such a preset stores the preset's template unless the
caller passes one (`chat_template=`) or declines it (`chat_template=False`).
KerasHub presets have none.
"""

import json
import logging
import os

from keras_vllm import format as fmt
from keras_vllm.errors import ExportError

logger = logging.getLogger("keras_vllm")

_JINJA_FILE = "chat_template.jinja"
_TOKENIZER_CONFIG = "tokenizer_config.json"


def _read_text(handle, name):
    """A preset file's text, or None when the preset has no such file."""
    from keras_hub.src.utils.preset_utils import get_file

    try:
        local = get_file(handle, name)
    except Exception:  # keras-hub raises many types for a missing file
        return None
    if not os.path.isfile(local):
        return None
    limit = fmt.MAX_CHAT_TEMPLATE_BYTES * 4
    if os.path.getsize(local) > limit:
        return None
    with open(local, encoding="utf-8", errors="replace") as f:
        return f.read()


def preset_template(handle):
    """The chat template of the Hugging Face checkpoint `handle`, or None.

    Args:
        handle: a preset handle or local preset directory.

    Returns:
        The template text (the `"default"` one of several named ones), or
        None when the preset has none.
    """
    text = _read_text(handle, _JINJA_FILE)
    if text:
        return text
    text = _read_text(handle, _TOKENIZER_CONFIG)
    try:
        template = json.loads(text).get("chat_template") if text else None
    except (ValueError, AttributeError):
        return None
    if isinstance(template, list):
        named = {
            t.get("name"): t.get("template")
            for t in template
            if isinstance(t, dict)
        }
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def resolve(chat_template, handle):
    """The template text to store: the caller's (text or a file's path),
    none for `False`, else the preset's own.

    Raises:
        ExportError: the template is larger than an artifact may hold.
    """
    if chat_template is False:
        return None
    if chat_template is None:
        if handle is None:
            return None
        chat_template = preset_template(handle)
        if chat_template is not None:
            logger.info(
                "keras-vllm: storing the chat template of the preset '%s' "
                "(chat_template=False leaves it out).", handle,
            )
    elif os.path.isfile(str(chat_template)):
        with open(chat_template, encoding="utf-8") as f:
            chat_template = f.read()
    if chat_template is None:
        return None
    size = len(chat_template.encode("utf-8"))
    if size > fmt.MAX_CHAT_TEMPLATE_BYTES:
        raise ExportError(
            f"The chat template is {size} bytes; an artifact holds at most "
            f"{fmt.MAX_CHAT_TEMPLATE_BYTES}. Pass a shorter one with "
            "`chat_template=`, or `chat_template=False` for none."
        )
    return chat_template
