"""One line in the server's log for each refusal keras-vllm makes.

A client that sends a request keras-vllm refuses gets the reason in the
answer; the server's log gets it too, so an operator sees why (the client
may be a script whose output nobody reads). `refused()` writes the line,
every refusing route calls it:

    WARNING ... keras-vllm refused POST /v1/load_lora_adapter (400):
    ArtifactError: '/adapters/x' has no manifest.json ...

(one line: the route, the status answered, the keras-vllm error class and
its message; ERROR instead of WARNING for a 5xx answer). It is logged on
`LOGGER_NAME`, a child of vLLM's `vllm` logger, so in a running server it
goes where and as vLLM's own lines go (`VLLM_LOGGING_STREAM`, stdout by
default; `VLLM_LOGGING_CONFIG_PATH`, `--log-format`); quiet serving keeps
vLLM's warnings, so it shows at default verbosity. Before any logging is
configured (plain `vllm serve DIR` refusing at start) the line goes to
stderr, `WARNING keras-vllm refused vllm serve: ...`.

Never in the line: a traceback, line breaks (a message's are flattened, so
a request cannot forge log lines), the query string, or a secret. The
server's API keys and the other secrets it was started with
(`SECRET_OPTIONS`, `SECRET_VARIABLES`), bearer tokens, `Authorization` and
`api_key=` values and PEM blocks (keys, certificates) are replaced by
`***`; a message is cut after `MAX_MESSAGE_CHARS`.

Callers: `adapters` and `reload` (their middlewares' own answers),
`refusals` (plain `vllm serve DIR`, before vLLM starts), and vLLM's
exception handler for requests it fails on a keras-vllm error (`install`):
chat without a template, content parts the artifact does not take, a chat
template over its bounds, any later `KerasVllmError` raised while vLLM
serves a request.

Patched: `exception_handler` of
`vllm.entrypoints.serve.exception_handling.handlers.exception` (vLLM
0.32.0; `vllm_error_handler` and the app's registration call it for every
`ValueError` and `VLLMError` a route raises), in the API server only.
"""

import logging
import os
import re
import sys

from keras_vllm import patching
from keras_vllm.errors import KerasVllmError

LOGGER_NAME = "vllm.keras_vllm.refusals"
logger = logging.getLogger(LOGGER_NAME)

# Command-line options and variables whose values are secrets (vLLM redacts
# the same options in its own "non-default args" line).
SECRET_OPTIONS = ("--api-key", "--hf-token")
SECRET_VARIABLES = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
REDACTED = "***"
MAX_MESSAGE_CHARS = 2000

_PEM = re.compile(
    r"-----BEGIN [^\n]*?-----.*?(?:-----END [^\n]*?-----|\Z)", re.DOTALL
)
_CREDENTIAL = re.compile(
    r"(?i)\b((?:authorization|api[_-]?key|(?:hf|access|auth)[_-]?token"
    r"|password)\s*[:=]\s*(?:bearer\s+)?|bearer\s+)[^\s,;'\"`]+"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_HANDLER_MODULE = "vllm.entrypoints.serve.exception_handling.handlers.exception"


def _secret_values(argv):
    """`(index, value)` of each secret option value in `argv` (an option
    may take several: vLLM's `--api-key K1 K2`)."""
    for i, arg in enumerate(argv):
        for name in SECRET_OPTIONS:
            if arg.startswith(name + "="):
                yield i, arg.split("=", 1)[1]
            elif arg == name:
                for j in range(i + 1, len(argv)):
                    if argv[j].startswith("-"):
                        break
                    yield j, argv[j]


def redact_argv(argv):
    """`argv` with the values of `SECRET_OPTIONS` replaced by `***`.

    Example:

    >>> redact_argv(["vllm", "serve", "out", "--api-key", "k1", "--port=1"])
    ['vllm', 'serve', 'out', '--api-key', '***', '--port=1']
    """
    shown = list(argv)
    for i, value in _secret_values(argv):
        shown[i] = shown[i][: len(shown[i]) - len(value)] + REDACTED
    return shown


def secrets(request=None, argv=None):
    """The secret values this process was given: `SECRET_OPTIONS` on its
    command line, `SECRET_VARIABLES`, and `request`'s server's API keys."""
    found = {value for _, value in _secret_values(sys.argv if argv is None
                                                  else argv)}
    found.update(os.environ.get(name) for name in SECRET_VARIABLES)
    state = getattr(getattr(request, "app", None), "state", None)
    keys = getattr(getattr(state, "args", None), "api_key", None)
    found.update([keys] if isinstance(keys, str) else keys or ())
    return {value for value in found if isinstance(value, str) and value}


def scrub(text, secret_values=()):
    """`text` as one log line: secrets replaced by `***` (see the module's
    docstring), control characters by spaces, cut after
    `MAX_MESSAGE_CHARS`.

    Example:

    >>> scrub("bad header Authorization: Bearer abc\\nnext", {"xyz"})
    'bad header Authorization: Bearer *** next'
    """
    text = _PEM.sub(REDACTED, str(text))
    for value in sorted(secret_values, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _CREDENTIAL.sub(lambda m: m.group(1) + REDACTED, text)
    text = _CONTROL.sub(" ", text).strip()
    if len(text) > MAX_MESSAGE_CHARS:
        cut = len(text) - MAX_MESSAGE_CHARS
        text = f"{text[:MAX_MESSAGE_CHARS]}... ({cut} more characters)"
    return text


def refused(error, *, request=None, route=None, status=None):
    """Logs one line for a refusal: WARNING, or ERROR for a 5xx answer.

    Example:

    ```python
    except KerasVllmError as e:
        refusal_log.refused(e, request=request, status=400)
        return error_response(str(e), 400)
    ```

    Args:
        error: the exception the client is answered with (its class is
            named).
        request: the Starlette request refused; names the route ("METHOD
            /path", without the query string) and its server's API keys.
        route: the route's name when there is no request (e.g. "vllm
            serve"), or instead of the request's.
        status: the HTTP status answered, if any.

    Returns:
        The logged message.
    """
    if route is None:
        route = f"{request.method} {request.url.path}"
    where = route if status is None else f"{route} ({status})"
    message = scrub(
        f"keras-vllm refused {where}: {type(error).__name__}: {error}",
        secrets(request),
    )
    level = logging.ERROR if (status or 0) >= 500 else logging.WARNING
    if logger.hasHandlers():
        logger.log(level, "%s", message)
    elif logger.isEnabledFor(level):
        # Nothing configured yet (plain `vllm serve DIR` refuses before vLLM
        # configures its logging): Python's last resort would drop the
        # level, so the line is written here, on stderr.
        print(f"{logging.getLevelName(level)} {message}", file=sys.stderr,
              flush=True)
    return message


def keras_vllm_error(error):
    """The first `KerasVllmError` in `error`'s chain (vLLM wraps some as
    its own `VLLMValidationError`), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KerasVllmError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def install():
    """Makes vLLM's API server log each request it answers with an error
    for a keras-vllm refusal (keras-vllm's vLLM plugin calls this in every
    vLLM process; where no API server was imported it does nothing)."""
    module = sys.modules.get(_HANDLER_MODULE)
    if module is None:
        return
    patching.replace(
        module, "exception_handler", _logging_refusals,
        everywhere="vllm.entrypoints",
    )


def _logging_refusals(original):
    async def exception_handler(req, exc):
        response = await original(req, exc)
        error = keras_vllm_error(exc)
        if error is not None:
            refused(error, request=req, status=response.status_code)
        return response

    return exception_handler
