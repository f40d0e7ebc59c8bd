"""Chat templates of keras-vllm artifacts: loading, rendering, no template.

Rendering uses the sandbox HF tokenizers render in (transformers'
environment: `trim_blocks`, `lstrip_blocks`, `loopcontrols`, `tojson`,
`raise_exception`, `strftime_now`, `{% generation %}`) and its
continue-final-message rule, so a template renders here as it does for an
HF tokenizer, but bounded in output size, work and time (`bounded_jinja`):
a hostile template fails its request with a 400, the server keeps serving.

An artifact may have no template (a choice at export). vLLM's HfRenderer
swallows exceptions raised by `get_chat_template()` and would report a
generic "no chat template" message, so `get_chat_template()` returns
`MISSING_CHAT_TEMPLATE` instead, and `render()` turns that marker into
`NoChatTemplateError`, which says how to add one (HfRenderer answers 400).
"""

import copy
import os

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError
from keras_vllm.serve.tokenizer import bounded_jinja

_NO_TEMPLATE_MARKER = "{#- keras_vllm: artifact has no chat template -#}"
# Rendered by any other Jinja engine, it still fails instead of producing an
# empty prompt.
# transformers' marker for the end of a message to continue.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
MISSING_CHAT_TEMPLATE = (
    _NO_TEMPLATE_MARKER
    + "{{ raise_exception('This keras-vllm artifact has no chat template; "
    "re-export it with export_vllm(..., chat_template=...).') }}"
)

try:
    from vllm.exceptions import ChatTemplateResolutionError
except ImportError:  # the tokenizer also works without vLLM

    class ChatTemplateResolutionError(Exception):
        pass


class NoChatTemplateError(
    ChatTemplateResolutionError, ServingError, ValueError
):
    """Chat was requested from an artifact that carries no chat template.

    vLLM's "no chat template" error (and a `ValueError`), so its OpenAI
    server answers 400, and its start-up chat warm-up notes the missing
    template quietly instead of logging a traceback; a `ServingError`, so
    it is caught with keras-vllm's other errors (and logged as a refusal by
    the server, `serve/frontend/refusal_log.py`).
    """


def read_template(path):
    """The artifact's chat template text, or None when it has none.

    Example:

    >>> read_template("exports/my_model")  # doctest: +SKIP
    "{% for m in messages %}..."

    Args:
        path: the artifact directory (its checksums are verified by the
            caller, `open_artifact`).
    """
    template_path = fmt.safe_join(path, fmt.CHAT_TEMPLATE_FILE)
    if not os.path.lexists(template_path):
        return None
    data = fmt.files.read_bytes(
        template_path, fmt.MAX_CHAT_TEMPLATE_BYTES, fmt.CHAT_TEMPLATE_FILE
    )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        fmt.checks.fail(
            f"{fmt.CHAT_TEMPLATE_FILE} is not UTF-8 text; re-export the model."
        )


def no_template_error(path):
    """The `NoChatTemplateError` for the artifact at `path`.

    The message names the artifact by its directory's name: vLLM's OpenAI
    server replaces absolute paths in error messages with a literal
    `'<path>'` (`vllm.entrypoints.serve.exception_handling.utils`, pinned
    0.32.0).
    """
    name = os.path.basename(os.path.normpath(str(path))) or str(path)
    return NoChatTemplateError(
        f"The keras-vllm artifact '{name}' has no chat template, "
        "so chat messages cannot be turned into a prompt. Re-export the "
        "model with one: `causal_lm.export_vllm(path, chat_template=...)` "
        "(Jinja text or a path to a .jinja file, stored as "
        f"'{fmt.CHAT_TEMPLATE_FILE}'); or pass a template to vLLM "
        "(`--chat-template` / the request's `chat_template`); or send "
        "plain-text prompts to the completions API."
    )


def render(
    source,
    conversation,
    *,
    path,
    tools=None,
    documents=None,
    add_generation_prompt=False,
    continue_final_message=False,
    **variables,
):
    """Renders one conversation with a chat template, as HF tokenizers do.

    Example:

    ```python
    render(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        [{"role": "user", "content": "hi"}],
        path="exports/my_model",
        bos_token="<s>",
    )  # "hi"
    ```

    Args:
        source: the template text, or `MISSING_CHAT_TEMPLATE`.
        conversation: the messages (dicts, or an object with `messages`).
        path: the artifact directory, named by `NoChatTemplateError`.
        tools: tool schemas (dicts), or None.
        documents: documents (dicts), or None.
        add_generation_prompt: end with the assistant's turn opener.
        continue_final_message: end right after the final message's text
            (no end-of-turn), for the model to continue it; a string names
            the message field to continue (default "content").
        **variables: template variables (`bos_token`, ... and the
            request's extra ones).

    Raises:
        NoChatTemplateError: `source` is `MISSING_CHAT_TEMPLATE`.
        ValueError: `continue_final_message` with `add_generation_prompt`,
            or with no final message text, or the template drops it.
    """
    if source.startswith(_NO_TEMPLATE_MARKER):
        raise no_template_error(path)
    if hasattr(conversation, "messages"):
        conversation = conversation.messages
    conversation = list(conversation)
    if continue_final_message:
        # transformers checks these in `apply_chat_template`, not in the
        # renderer (which would fail on no messages with a bare IndexError).
        if add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt are not "
                "compatible: use continue_final_message to continue the "
                "final message, add_generation_prompt to start a new one."
            )
        if not conversation:
            raise ValueError(
                "continue_final_message is set but there are no messages."
            )

    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise ValueError("Tools must be JSON schemas (dicts).")
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise TypeError("Documents should be a list of dicts.")
    field = None
    if continue_final_message:
        # transformers' rule: mark the end of the final message's text, and
        # cut the rendered prompt right after it.
        field = (
            continue_final_message
            if isinstance(continue_final_message, str)
            else "content"
        )
        if field not in source:
            raise ValueError(
                f'continue_final_message is set to "{field}" but this is not '
                "an accepted field in the chat_template"
            )
        conversation = copy.deepcopy(conversation)
        final = conversation[-1].get(field)
        if final is None:
            raise ValueError(
                f'continue_final_message is set but the final message has no '
                f'"{field}" to continue!'
            )
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError(
                    "continue_final_message is set but we could not find any "
                    "text to continue in the final message!"
                )
        else:
            conversation[-1][field] = final + _CONTINUE_TAG
    rendered = bounded_jinja.render(
        source,
        messages=conversation,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    if field is not None:
        if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise ValueError(
                "continue_final_message is set but the final message does not "
                "appear in the chat after applying the chat template!"
            )
        cut = rendered.rindex(_CONTINUE_TAG.strip())
        if rendered[cut : cut + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            rendered = rendered[:cut]
        else:  # the template trimmed the message's trailing space
            rendered = rendered[:cut].rstrip()
    return rendered
