"""Progress of long exports and loads: one line per phase.

On a terminal each phase draws a live line (a bar when its size is known, a
running clock otherwise) that is replaced by a one-line summary when the
phase ends. Elsewhere (pipes, files, CI) nothing is drawn and each phase
logs its summary through the `keras_vllm` logger at INFO level, so scripts
and CI logs stay quiet unless logging is configured.

`verbose` follows Keras' `fit(verbose=...)`: `"auto"` (the default) draws
only on a terminal outside CI, `True` also prints the summaries when not on
a terminal, `False` draws and prints nothing, `"lines"` prints summaries
and never draws (for processes that share a terminal). The
`KERAS_VLLM_PROGRESS` environment variable (`0`, `1`, `auto` or `lines`)
sets the default.

Example:

```python
with progress.phase("recording golden outputs", total=9, unit="prompts") as p:
    for prompt in prompts:
        ...
        p.advance()
```
"""

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time

logger = logging.getLogger("keras_vllm")

ENV = "KERAS_VLLM_PROGRESS"
# "lines": vLLM's engine processes print one line per phase (keras-vllm serve).
ENGINE_ENV = "KERAS_VLLM_ENGINE_PROGRESS"
_BAR_WIDTH = 24
_REDRAW_SECONDS = 0.1
_CLOCK_SECONDS = 0.5

_verbose = contextvars.ContextVar("keras_vllm_progress_verbose", default=None)
_active = contextvars.ContextVar("keras_vllm_progress_phase", default=None)


def _parse(verbose):
    if isinstance(verbose, str):
        value = verbose.strip().lower()
        if value in ("auto", "lines"):
            return value
        if value in ("0", "false", "no", "off", ""):
            return False
        if value in ("1", "true", "yes", "on"):
            return True
        raise ValueError(
            f"verbose must be 'auto', 'lines', True or False; got {verbose!r}."
        )
    return bool(verbose)


def resolve(verbose="auto", stream=None):
    """How progress is shown: `"bar"`, `"line"` or `"log"`.

    Args:
        verbose: `"auto"`, True or False (see the module docstring).
        stream: where bars and lines go; defaults to `sys.stderr`.
    """
    if verbose in ("auto", None):
        verbose = _verbose.get()
    if verbose in ("auto", None):
        verbose = os.environ.get(ENV, "auto")
    verbose = _parse(verbose)
    if verbose is False:
        return "log"
    if verbose == "lines":
        return "line"
    stream = stream or sys.stderr
    on_terminal = bool(getattr(stream, "isatty", lambda: False)())
    in_ci = bool(os.environ.get("CI")) or os.environ.get("TERM") == "dumb"
    if on_terminal and not (verbose == "auto" and in_ci):
        return "bar"
    return "line" if verbose is True else "log"


@contextlib.contextmanager
def verbosity(verbose):
    """Sets the `verbose` that phases inside this block default to."""
    token = _verbose.set(_parse(verbose))
    try:
        yield
    finally:
        _verbose.reset(token)


def _size(n, unit):
    if unit != "bytes":
        return f"{n:,}"
    for scale, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {suffix}"
    return f"{n} B"


class Phase:
    """One phase of a long operation; see `phase()`."""

    def __init__(self, description, total, unit, mode, stream):
        self.description = description
        self.total = total
        self.unit = unit
        self.count = 0
        self._mode = mode
        self._stream = stream
        self._start = time.monotonic()
        self._drawn = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clock = None

    def advance(self, n=1):
        """Counts `n` more units done."""
        self.count += n
        if self._mode == "bar":
            now = time.monotonic()
            if now - self._drawn >= _REDRAW_SECONDS:
                self._draw(now)

    def _progress_text(self):
        if not self.total:
            return _size(self.count, self.unit) if self.count else ""
        done = min(self.count / self.total, 1.0)
        filled = int(done * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        return (
            f"[{bar}] {_size(self.count, self.unit)}/"
            f"{_size(self.total, self.unit)}"
        )

    def _draw(self, now):
        elapsed = now - self._start
        parts = [f"keras-vllm: {self.description}", self._progress_text()]
        if self.unit and self.unit != "bytes" and self.total:
            parts[-1] += f" {self.unit}"
        parts.append(f"{elapsed:.0f}s")
        with self._lock:
            self._drawn = now
            self._stream.write("\r\x1b[K" + "  ".join(p for p in parts if p))
            self._stream.flush()

    def _tick(self):
        while not self._stop.wait(_CLOCK_SECONDS):
            self._draw(time.monotonic())

    def _open(self):
        if self._mode != "bar":
            return
        self._draw(time.monotonic())
        if not self.total:
            # Nothing advances an open-ended phase (an engine starting in
            # another process): a clock shows it is alive.
            self._clock = threading.Thread(target=self._tick, daemon=True)
            self._clock.start()

    def summary(self, failed=False):
        elapsed = time.monotonic() - self._start
        done = ""
        if self.count and self.unit:
            unit = "" if self.unit == "bytes" else f" {self.unit}"
            done = f", {_size(self.count, self.unit)}{unit}"
        state = "failed after" if failed else "done in"
        return f"keras-vllm: {self.description}: {state} {elapsed:.1f}s{done}"

    def _close(self, failed):
        if self._clock is not None:
            self._stop.set()
            self._clock.join()
        line = self.summary(failed)
        if self._mode == "log":
            logger.info(line)
            return
        with self._lock:
            prefix = "\r\x1b[K" if self._mode == "bar" else ""
            self._stream.write(prefix + line + "\n")
            self._stream.flush()


@contextlib.contextmanager
def phase(
    description, total=None, unit="", verbose="auto", stream=None, live=True
):
    """A phase of a long operation, shown as one line.

    Args:
        description: what is being done, e.g. `"writing weights"`.
        total: the number of units the phase will do, if known.
        unit: what is counted (`"bytes"` prints sizes).
        verbose: `"auto"`, True or False (see the module docstring).
        stream: defaults to `sys.stderr`.
        live: draw a live line on a terminal; False prints only the summary
            (when other output, such as verbose logs, shares the terminal).

    Yields:
        A `Phase`; call `advance(n)` as work gets done.
    """
    stream = stream or sys.stderr
    outer = _active.get()
    mode = resolve(verbose, stream)
    if mode == "bar" and not live:
        mode = "line"
    if outer is not None:
        # One line at a time: the outer phase speaks for nested ones.
        mode = "log"
    current = Phase(description, total, unit, mode, stream)
    token = _active.set(current)
    current._open()
    failed = True
    try:
        yield current
        failed = False
    finally:
        _active.reset(token)
        current._close(failed)


def advance(n=1):
    """Advances the innermost open phase, if any (for code deep in a call)."""
    current = _active.get()
    if current is not None:
        current.advance(n)
