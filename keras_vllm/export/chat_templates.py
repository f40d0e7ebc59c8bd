"""The chat template an export stores.

An instruction-tuned Hugging Face checkpoint carries its chat template
(`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`), and
keras-hub's converter leaves it behind: a model fine-tuned from
`hf://meta-llama/Llama-3.2-1B-Instruct` would export without one, and
`/v1/chat/completions` would refuse every request. So an export whose
model came from such a preset stores the preset's template unless the
caller passes one (`chat_template=`) or declines it (`chat_template=False`).

KerasHub presets carry no template file, but keras-hub knows which of its
presets are instruction-tuned (their names and descriptions) and each
family's tokenizer declares the special tokens of its chat format. An
export of a model from an instruction-tuned KerasHub preset stores its
family's chat format, registered by the family's module in
`keras_vllm/layers/` (`registry.register_chat_template`).
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


def _preset_names(handle):
    """The names a handle may carry a KerasHub preset's name under: itself,
    and each component of its path (`kaggle://keras/gemma2/keras/
    gemma2_instruct_2b_en/2`, or the local copy keras-hub downloads it to)."""
    text = str(handle).split("://", 1)[-1].rstrip("/")
    return [text] + [part for part in text.split("/") if part]


def instruction_tuned(handle):
    """Whether `handle` names one of keras-hub's instruction-tuned presets.

    Judged by what keras-hub's preset registry says of the preset: its
    description ("instruction tuned") or its name (`*_instruct_*`, `*_it`).
    """
    import keras_hub

    known = keras_hub.models.Backbone.presets
    for name in _preset_names(handle):
        if name not in known:
            continue
        description = str(
            known[name].get("metadata", {}).get("description", "")
        ).lower()
        return (
            "instruct" in description
            or "instruct" in name
            or name.endswith("_it")
        )
    return False


def family_template(handle, tokenizer):
    """The family's chat format for a model from an instruction-tuned
    KerasHub preset (`instruction_tuned`), or None."""
    if handle is None or tokenizer is None or not instruction_tuned(handle):
        return None
    from keras_vllm.layers import families  # noqa: F401  (registers them)
    from keras_vllm.layers.common import registry

    return registry.chat_template(tokenizer)


def resolve(chat_template, handle, tokenizer=None):
    """The template text to store: the caller's (text or a file's path),
    none for `False`, else the preset's own (a Hugging Face checkpoint's
    file, or the family's format for an instruction-tuned KerasHub preset).

    Raises:
        ExportError: the template is larger than an artifact may hold.
    """
    if chat_template is False:
        return None
    if chat_template is None:
        if handle is None:
            return None
        chat_template = preset_template(handle)
        if chat_template is None:
            chat_template = family_template(handle, tokenizer)
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


def warn_if_no_start_token(template, preprocessor, tokenizer):
    """Warns when chats would reach the model without its start token.

    vLLM tokenizes a rendered chat without adding special tokens (as
    Hugging Face does: templates write their own), while the model's
    preprocessor puts a start token before every prompt it fine-tuned and
    `generate()`s on. A template that never writes it (`bos_token`, or the
    token's text) then shows the model prompts it never saw.

    Returns:
        Whether it warned.
    """
    start_id = getattr(tokenizer, "start_token_id", None)
    if template is None or start_id is None:
        return False
    if not getattr(preprocessor, "add_start_token", False):
        return False
    start = getattr(tokenizer, "start_token", None)
    if "bos_token" in template or (start and start in template):
        return False
    logger.warning(
        "keras-vllm: the chat template never writes the start token (%r), "
        "which the model's preprocessor puts before every prompt: chat "
        "requests will reach the model without it (vLLM adds no special "
        "tokens to a rendered chat). Begin the template with "
        "`{{ bos_token }}` to serve chats as the model was trained.",
        start,
    )
    return True
