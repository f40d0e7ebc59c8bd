"""Progress of long exports and loads: one line per phase.

On a terminal each phase draws a live line with `rich` (a bar and counts
when its size is known, a running clock always) that is replaced by a
one-line summary when the phase ends; a phase opened inside another is
folded into the outer one's line. Elsewhere (pipes, files, CI) nothing is
drawn and each phase logs its summary through the `keras_vllm` logger at INFO level, so scripts
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
import sys
import time

from rich import console as rich_console
from rich import progress as rich_progress

from keras_vllm import envs

logger = logging.getLogger("keras_vllm")

# Kept for callers that name the variables (serve/worker/model.py, tests).
ENV = envs.PROGRESS.name
# "lines": vLLM's engine processes print one line per phase (keras-vllm serve).
ENGINE_ENV = envs.ENGINE_PROGRESS.name
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
        verbose = envs.PROGRESS.get()
    verbose = _parse(verbose)
    if verbose is False:
        return "log"
    if verbose == "lines":
        return "line"
    stream = stream or sys.stderr
    on_terminal = bool(getattr(stream, "isatty", lambda: False)())
    if on_terminal and not (verbose == "auto" and envs.in_ci()):
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


def _columns(total, unit):
    """rich columns for one line: what, a bar when the size is known, the
    count, the time so far."""
    columns = [
        rich_progress.TextColumn("keras-vllm: {task.description}", markup=False)
    ]
    if total:
        columns.append(rich_progress.BarColumn(bar_width=_BAR_WIDTH))
    if unit == "bytes":
        columns.append(rich_progress.DownloadColumn(binary_units=True))
    elif total:
        columns.append(rich_progress.MofNCompleteColumn())
    elif unit:
        columns.append(rich_progress.TextColumn("{task.completed:,.0f}"))
    if unit and unit != "bytes":
        columns.append(rich_progress.TextColumn(unit, markup=False))
    columns.append(rich_progress.TimeElapsedColumn())
    return columns


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
        self._bar = None
        self._task = None

    def advance(self, n=1):
        """Counts `n` more units done."""
        self.count += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.count)
            # rich redraws on its own clock; a phase that advances often
            # is redrawn sooner, at most every `_REDRAW_SECONDS`.
            now = time.monotonic()
            if now - self._drawn >= _REDRAW_SECONDS:
                self._drawn = now
                self._bar.refresh()

    def _open(self):
        if self._mode != "bar":
            return
        console = rich_console.Console(
            file=self._stream, force_terminal=True, highlight=False
        )
        # Transient: the live line is erased and replaced by the summary, so
        # each phase leaves one line on a terminal that vLLM's processes may
        # share. The clock keeps open-ended phases visibly alive.
        self._bar = rich_progress.Progress(
            *_columns(self.total, self.unit),
            console=console,
            transient=True,
            refresh_per_second=1 / _CLOCK_SECONDS,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._task = self._bar.add_task(
            self.description, total=self.total or None
        )
        self._bar.start()
        self._drawn = time.monotonic()

    def summary(self, failed=False):
        elapsed = time.monotonic() - self._start
        done = ""
        if self.count and self.unit:
            unit = "" if self.unit == "bytes" else f" {self.unit}"
            done = f", {_size(self.count, self.unit)}{unit}"
        state = "failed after" if failed else "done in"
        return f"keras-vllm: {self.description}: {state} {elapsed:.1f}s{done}"

    def _close(self, failed):
        if self._bar is not None:
            self._bar.stop()
        line = self.summary(failed)
        if self._mode == "log":
            logger.info(line)
            return
        self._stream.write(line + "\n")
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
