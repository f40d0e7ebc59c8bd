"""The server's log line for a refusal (`serve/frontend/refusal_log.py`),
without a server: its words, its level, and what never reaches it.

The servers that write it are tested where they already run:
`test_hardened_server.py` (adapter loads, the reload route, chat without a
template, an image for a text-only artifact, with `--api-key`),
`test_serving_images_http.py` (audio and video parts) and
`test_vllm_serve_refusals.py` (plain `vllm serve DIR`). About 1 s.
"""

import contextlib
import logging
import types

import pytest

from keras_vllm import logs
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import RequestError
from keras_vllm.serve.frontend import refusal_log

KEY = "sk-server-key-42"
PEM = (
    "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBx0\nAoGCCqGSM49\n"
    "-----END EC PRIVATE KEY-----"
)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def _records(name):
    target = logging.getLogger(name)
    handler, level = _Collect(), target.level
    target.addHandler(handler)
    target.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


def _request(method="POST", path="/v1/load_lora_adapter", keys=(KEY,)):
    return types.SimpleNamespace(
        method=method,
        url=types.SimpleNamespace(path=path, query="api_key=" + KEY),
        app=types.SimpleNamespace(state=types.SimpleNamespace(
            args=types.SimpleNamespace(api_key=list(keys))
        )),
    )


def test_one_warning_line_names_the_route_status_class_and_message():
    error = ArtifactError("'/adapters/x' has no manifest.json.\nExport it.")
    with _records(refusal_log.LOGGER_NAME) as records:
        refusal_log.refused(error, request=_request(), status=400)
    (record,) = records
    assert record.levelno == logging.WARNING
    assert record.exc_info is None  # no traceback
    assert record.getMessage() == (
        "keras-vllm refused POST /v1/load_lora_adapter (400): ArtifactError: "
        "'/adapters/x' has no manifest.json. Export it."
    )
    # Under vLLM's logger: its handler, format and level apply.
    assert refusal_log.LOGGER_NAME.startswith("vllm.")


def test_a_5xx_answer_is_an_error_line_and_a_route_can_be_named():
    with _records(refusal_log.LOGGER_NAME) as records:
        refusal_log.refused(RuntimeError("worker"), route="POST /r", status=500)
        refusal_log.refused(RequestError("bad"), route="vllm serve")
    assert [r.levelno for r in records] == [logging.ERROR, logging.WARNING]
    assert records[1].getMessage() == (
        "keras-vllm refused vllm serve: RequestError: bad"
    )


def test_no_secret_reaches_the_line(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "env-key-77")
    monkeypatch.setattr(
        "sys.argv", ["vllm", "serve", "out", "--api-key", "argv-key-1",
                     "argv-key-2", "--hf-token=hf_secret", "--port", "1"],
    )
    error = ArtifactError(
        f"'/adapters/{KEY}' env-key-77 argv-key-1 argv-key-2 hf_secret "
        f"Authorization: Bearer given-token api_key=abc {PEM} end"
    )
    message = refusal_log.refused(error, request=_request(), status=400)
    for secret in (KEY, "env-key-77", "argv-key-1", "argv-key-2", "hf_secret",
                   "given-token", "abc", "MHcCAQEEIBx0", "PRIVATE KEY"):
        assert secret not in message, (secret, message)
    assert "\n" not in message
    assert message.endswith(" end")
    assert f"/adapters/{refusal_log.REDACTED}'" in message


def test_a_long_message_is_cut():
    message = refusal_log.scrub("x" * (refusal_log.MAX_MESSAGE_CHARS + 5))
    assert message.endswith("... (5 more characters)")


@pytest.mark.parametrize("argv, shown", [
    (["vllm", "serve", "o", "--api-key", "a", "b", "--port", "1"],
     ["vllm", "serve", "o", "--api-key", "***", "***", "--port", "1"]),
    (["vllm", "serve", "o", "--api-key=a", "--hf-token", "t"],
     ["vllm", "serve", "o", "--api-key=***", "--hf-token", "***"]),
    (["vllm", "serve", "o"], ["vllm", "serve", "o"]),
])
def test_the_printed_command_line_hides_secret_options(argv, shown):
    assert refusal_log.redact_argv(argv) == shown


def test_a_keras_vllm_error_is_found_under_vllms_wrapper():
    from keras_vllm.serve.tokenizer import NoChatTemplateError

    cause = NoChatTemplateError("none")
    try:
        try:
            raise cause
        except NoChatTemplateError as e:
            raise ValueError("wrapped") from e
    except ValueError as wrapped:
        assert refusal_log.keras_vllm_error(wrapped) is cause
    assert refusal_log.keras_vllm_error(ValueError("vLLM's own")) is None


def test_vllms_echo_of_a_refusal_is_dropped_its_own_errors_kept(monkeypatch):
    monkeypatch.delenv(logs.VERBOSE_ENV, raising=False)
    logs.install_false_alarm_filters()
    (name,) = logs.ECHOES_OF_REFUSALS
    echo = logging.getLogger(name)
    with _records(name) as records:
        for error in (RequestError("ours"), ValueError("vLLM's")):
            record = echo.makeRecord(
                name, logging.WARNING, __file__, 1,
                "Chat template rejected the request: %s", (error,), None,
            )
            echo.handle(record)  # through the logger's filters
    assert [r.getMessage() for r in records] == [
        "Chat template rejected the request: vLLM's"
    ]
