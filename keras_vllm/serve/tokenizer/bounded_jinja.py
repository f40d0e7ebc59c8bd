"""Chat-template rendering bounded in output size, work and time.

A chat template comes from the artifact (or a request) and runs in vLLM's
front-end process for every chat request, so a template that builds a huge
string (`{{ 'x' * 10**9 }}`, nested loops, `10 ** 10 ** 9`) must fail that
one request, not the server. Templates render in the sandbox HF tokenizers
use (transformers' environment: its extensions, `tojson`,
`raise_exception`, `strftime_now`), subclassed so that:

- `*`, `**`, `+` and `%` check the size of what they would build first;
- every call and filter refuses size arguments beyond the output limit and
  counts what it returns against a per-render budget;
- `range` counts its iterations against the same budget;
- the output is collected chunk by chunk up to the limit;
- a per-thread trace on the template's own frames stops a render that runs
  past its deadline (loops that produce nothing and call nothing).

Exceeding any bound raises `ChatTemplateLimitError`, a `ValueError`, which
vLLM's OpenAI server answers with HTTP 400.
"""

import functools
import re
import sys
import threading
import time

from keras_vllm.errors import KerasVllmError

MAX_OUTPUT_CHARS = 4 << 20
# Characters all calls, filters and operators of one render may produce,
# and iterations of `range`.
MAX_WORK = 64 << 20
MAX_SECONDS = 2.0

_STATE = threading.local()
_WIDTH = re.compile(r"\d{7,}")


class ChatTemplateLimitError(KerasVllmError, ValueError):
    """A chat template exceeded the output, work or time bound."""


def _limit(what):
    raise ChatTemplateLimitError(
        f"The chat template {what} (limits: {MAX_OUTPUT_CHARS} characters "
        f"of output, {MAX_WORK} of intermediate work, {MAX_SECONDS:g} s). The "
        "template is hostile or broken: fix the artifact's "
        "chat_template.jinja (re-export) or pass another `chat_template`."
    )


def _budget():
    state = getattr(_STATE, "render", None)
    if state is None:  # compiled elsewhere, rendered outside `render()`
        state = _STATE.render = {"work": 0, "deadline": None}
    return state


def _charge(n):
    state = _budget()
    state["work"] += n
    if state["work"] > MAX_WORK:
        _limit("does too much work")
    deadline = state["deadline"]
    if deadline is not None and time.monotonic() > deadline:
        _limit("takes too long to render")


def _size(value):
    if isinstance(value, (str, bytes, list, tuple, dict, set)):
        return len(value)
    return 0


def _check_args(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_OUTPUT_CHARS:
                _limit(f"passes the size {value} to a call")
        elif isinstance(value, (list, tuple)) and len(value) <= 100_000:
            total = sum(_size(v) for v in value)
            if total > MAX_OUTPUT_CHARS:
                _limit("joins more text than its output may hold")


def _bounded(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        _check_args(args, kwargs)
        result = fn(*args, **kwargs)
        _charge(_size(result) + 1)
        if _size(result) > MAX_OUTPUT_CHARS:
            _limit("builds a value larger than its output may be")
        return result

    return call


def _range(*args):
    _check_args(args, {})
    for i in range(*args):
        _charge(1)
        yield i


def _environment_class():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if _size(seq) and isinstance(count, int):
                        if _size(seq) * max(count, 0) > MAX_OUTPUT_CHARS:
                            _limit("repeats a value beyond its output limit")
            elif operator == "**":
                if isinstance(left, int) and isinstance(right, int):
                    if abs(left) > 1 and right * max(left.bit_length(), 1) > 4096:
                        _limit("computes a number too large")
            elif operator == "+":
                if _size(left) + _size(right) > MAX_OUTPUT_CHARS:
                    _limit("concatenates beyond its output limit")
            elif operator == "%" and isinstance(left, str):
                if any(int(w) > MAX_OUTPUT_CHARS for w in _WIDTH.findall(left)):
                    _limit("formats a field too wide")
            result = super().call_binop(context, operator, left, right)
            _charge(_size(result) + 1)
            return result

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: B902, N805
            _check_args(args, kwargs)
            result = super().call(__context, __obj, *args, **kwargs)
            _charge(_size(result) + 1)
            if _size(result) > MAX_OUTPUT_CHARS:
                _limit("builds a value larger than its output may be")
            return result

    return BoundedEnvironment


@functools.lru_cache(maxsize=16)
def _transformers_environment():
    """transformers' chat-template environment (extensions, filters and
    globals), compiled once from a trivial template."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template("").environment


@functools.lru_cache(maxsize=32)
def compile_template(source):
    """Compiles a chat template in the bounded sandbox (cached by text)."""
    import jinja2.ext

    reference = _transformers_environment()
    extensions = [type(e) for e in reference.extensions.values()]
    if jinja2.ext.LoopControlExtension not in extensions:
        extensions.append(jinja2.ext.LoopControlExtension)
    env = _environment_class()(
        trim_blocks=True, lstrip_blocks=True, extensions=extensions
    )
    env.filters.update(reference.filters)
    env.filters = {name: _bounded(f) for name, f in env.filters.items()}
    env.globals.update(reference.globals)
    env.globals["range"] = _range
    return env.from_string(source)


def _tracer(deadline):
    def local(frame, event, arg):
        if time.monotonic() > deadline:
            _limit("takes too long to render")
        return local

    def global_(frame, event, arg):
        if time.monotonic() > deadline:
            _limit("takes too long to render")
        if frame.f_code.co_filename == "<template>":
            return local
        return None

    return global_


def render(source, **variables):
    """Renders a chat template with `variables`, within the bounds.

    Example:

    ```python
    render("{% for m in messages %}{{ m['content'] }}{% endfor %}",
           messages=[{"role": "user", "content": "hi"}])  # "hi"
    ```

    Raises:
        ChatTemplateLimitError: the template exceeded a bound.
        jinja2.TemplateError: the template is invalid or raised.
    """
    template = compile_template(source)
    deadline = time.monotonic() + MAX_SECONDS
    _STATE.render = {"work": 0, "deadline": deadline}
    previous = sys.gettrace()
    sys.settrace(_tracer(deadline))
    try:
        out, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                _limit(f"renders more than {MAX_OUTPUT_CHARS} characters")
            out.append(chunk)
        return "".join(out)
    except (MemoryError, RecursionError, OverflowError) as e:
        _limit(f"fails with {type(e).__name__}")
    finally:
        sys.settrace(previous)
        _STATE.render = None
