"""Progress lines (live on a terminal, quiet elsewhere) and log filtering."""

import io
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from keras_vllm import logs
from keras_vllm import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


_TOKENS = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\r|\n|[^\x1b\r\n]+")


def _screen(text):
    """The lines a terminal shows once it has been sent `text`."""
    lines, row, col = [""], 0, 0
    for match in _TOKENS.finditer(text):
        token, command = match.group(0), match.group(2)
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif command == "K":  # erase in line: to its end (0) or all of it (2)
            lines[row] = "" if match.group(1) == "2" else lines[row][:col]
        elif command == "A":  # cursor up
            row = max(0, row - int(match.group(1) or 1))
        elif command is None:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
        # Anything else (colours, cursor visibility) moves nothing.
    return lines


def _plain(text):
    """`text` without colours: the frames as drawn, control codes kept."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture(autouse=True)
def _no_ci(monkeypatch):
    for name in ("CI", progress.ENV, logs.VERBOSE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def test_terminal_draws_a_bar_then_one_summary_line():
    out = _Terminal()
    with progress.phase("writing", total=4, unit="files", stream=out) as p:
        for _ in range(4):
            time.sleep(progress._REDRAW_SECONDS)
            p.advance()
    text = out.getvalue()
    assert "\r\x1b[2K" in text  # the live line is redrawn in place
    assert re.search(r"keras-vllm: writing [━╺╸ ]+ 1/4 files", _plain(text))
    lines = _screen(text)
    assert len(lines) == 2 and lines[1] == ""  # one finished line
    assert lines[0].startswith("keras-vllm: writing: done in ")
    assert lines[0].endswith(", 4 files")


def test_byte_counts_are_readable():
    out = _Terminal()
    with progress.phase("hashing", total=3 << 20, unit="bytes", stream=out) as p:
        time.sleep(progress._REDRAW_SECONDS)
        p.advance(1 << 20)
    assert "1.0/3.0 MiB" in _plain(out.getvalue())
    assert out.getvalue().endswith(", 1.0 MiB\n")


def test_open_ended_phase_shows_a_running_clock():
    out = _Terminal()
    with progress.phase("starting", stream=out):
        time.sleep(3 * progress._CLOCK_SECONDS + 0.2)
    clocks = re.findall(
        r"keras-vllm: starting (\d+:\d\d:\d\d)", _plain(out.getvalue())
    )
    assert len(clocks) >= 3 and "0:00:01" in clocks


def test_not_a_terminal_prints_nothing_and_logs_the_summary(caplog):
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="keras_vllm"):
        with progress.phase("writing", total=2, stream=out) as p:
            p.advance(2)
    assert out.getvalue() == ""
    assert [r.getMessage().split(":")[1] for r in caplog.records] == [
        " writing"
    ]


def test_ci_is_quiet_even_on_a_terminal(monkeypatch):
    monkeypatch.setenv("CI", "true")
    out = _Terminal()
    with progress.phase("writing", total=2, stream=out) as p:
        p.advance(2)
    assert out.getvalue() == ""


def test_verbose_prints_one_plain_line_per_phase_off_a_terminal():
    out = io.StringIO()
    with progress.verbosity(True):
        for name in ("first", "second"):
            with progress.phase(name, total=1, stream=out) as p:
                p.advance()
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1] for line in lines] == [" first", " second"]
    assert "\r" not in out.getvalue()


def test_quiet_draws_nothing_on_a_terminal():
    out = _Terminal()
    with progress.verbosity(False):
        with progress.phase("writing", total=1, stream=out) as p:
            p.advance()
    assert out.getvalue() == ""


def test_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv(progress.ENV, "0")
    assert progress.resolve("auto", _Terminal()) == "log"
    monkeypatch.setenv(progress.ENV, "1")
    assert progress.resolve("auto", io.StringIO()) == "line"
    with progress.verbosity("auto"):  # what export_vllm() passes by default
        assert progress.resolve("auto", io.StringIO()) == "line"
    with pytest.raises(ValueError, match="verbose must be"):
        progress.resolve("sometimes", io.StringIO())


def test_nested_phases_share_the_outer_line():
    out = _Terminal()
    with progress.phase("outer", stream=out):
        with progress.phase("inner", total=1, stream=out) as inner:
            progress.advance()
    assert inner.count == 1
    assert "inner" not in out.getvalue()


def test_failed_phase_says_so_and_raises():
    out = io.StringIO()
    with pytest.raises(KeyError):
        with progress.phase("writing", stream=out, verbose=True):
            raise KeyError("x")
    assert "writing: failed after" in out.getvalue()


def test_false_alarms_are_dropped_and_other_records_kept(caplog):
    logs.install_false_alarm_filters()
    noisy = logging.getLogger("vllm.tpu_inference.tpu_info")
    with caplog.at_level(logging.INFO):
        noisy.error("Unable to poll the TPU GCE Metadata: no route")
        noisy.error("Something real went wrong")
    assert [r.getMessage() for r in caplog.records] == [
        "Something real went wrong"
    ]


def _import_serving_stack(**env):
    # A fresh process: the messages are logged once, at import time.
    code = "import keras_vllm, vllm, tpu_inference"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    ).stderr


def test_serving_stack_start_up_false_alarms_are_gone_unless_verbose():
    alarms = ("TPU GCE Metadata", "Error getting device name")
    quiet = _import_serving_stack()
    assert not [a for a in alarms if a in quiet], quiet[-3000:]
    assert quiet.count("serving with tpu-inference on JAX CPU devices") <= 1
    loud = _import_serving_stack(**{logs.VERBOSE_ENV: "1"})
    assert all(a in loud for a in alarms), loud[-3000:]


def test_missing_chat_template_warm_up_is_not_a_warning(caplog):
    from keras_vllm.serve.tokenizer import NoChatTemplateError

    logs.install_false_alarm_filters()
    renderer = logging.getLogger("vllm.renderers.base")
    with caplog.at_level(logging.INFO):
        for error in (NoChatTemplateError("none"), KeyError("broken")):
            try:
                raise RuntimeError("wrapped") from error
            except RuntimeError:
                renderer.warning("Chat template warmup failed", exc_info=True)
    # A broken template is still reported; a missing one is not.
    assert len(caplog.records) == 1
    assert caplog.records[0].exc_info[1].__cause__.args == ("broken",)


def test_export_and_load_show_each_phase_on_a_terminal(monkeypatch, tmp_path):
    import keras_vllm
    from keras_vllm import testing

    causal_lm = testing.build_tiny_causal_lm("gpt2")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    path = causal_lm.export_vllm(tmp_path / "a", golden_prompts=["a", "b"])
    keras_vllm.load_causal_lm(path)
    finished = [
        re.fullmatch(r"keras-vllm: (.*?): done in .*", line).group(1)
        for line in _screen(terminal.getvalue())[:-1]
    ]
    assert finished == [
        "collecting weights",
        "writing weights",
        # The files are hashed while the golden outputs are generated.
        "writing checksums",
        "recording golden outputs",
        "verifying checksums",
        "building GPT2Backbone",
        "restoring full weights",
    ]
    # Golden outputs are one batched call (no per-prompt steps); a
    # byte-counted phase shows its live count.
    assert re.search(r"[\d.]+/[\d.]+ KiB", _plain(terminal.getvalue()))

    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    keras_vllm.load_causal_lm(path)
    assert piped.getvalue() == ""
