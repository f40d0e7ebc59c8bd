"""Keeps vLLM's and tpu-inference's start-up noise out of the user's way.

Two levels, both undone by `KERAS_VLLM_VERBOSE=1`:

- Always: log records known to be false alarms on a supported host are
  dropped (tpu-inference polling GCE metadata and `/dev/vfio` on a machine
  that is not a TPU VM, "Error getting device name" on CPU devices, vLLM
  missing CUDA kernels it never uses, a "slow tokenizer" warning about
  keras-vllm's own tokenizer, ...). Each is matched by logger name and
  message, so any other record from the same logger still shows. So is
  vLLM's second line for a request refused with a keras-vllm error, which
  keras-vllm logs itself (`serve/frontend/refusal_log.py`).
- Quiet serving (`KerasVllmEngine.from_export` and the `keras-vllm`
  command unless verbose): vLLM logs warnings and errors only, in the
  engine's processes too. (TensorFlow, which keras-hub imports, prints a
  few C++ lines at import that no setting of TensorFlow 2.21 turns off.)
"""

import contextlib
import functools
import logging
import os
import re
import sys
import tempfile

from keras_vllm import envs
from keras_vllm import patching
from keras_vllm.errors import KerasVllmError

# Kept for callers that name the variable.
VERBOSE_ENV = envs.VERBOSE.name

# logger name -> messages that are false alarms on the hosts keras-vllm
# supports (a CPU host or a TPU VM).
FALSE_ALARMS = {
    "vllm.tpu_inference.tpu_info": (
        r"Unable to poll the TPU GCE Metadata",
        r"Failed to detect number of TPUs",
    ),
    "vllm.tpu_inference": (r"Error occurred while logging TPU info",),
    "vllm.tpu_inference.platforms.tpu_platform": (
        r"Error getting device name",
        r"Pin memory is not supported on TPU",
    ),
    "vllm.usage.usage_lib": (r"Failed to collect TPU information",),
    # An empty scheduler step (vLLM sends them, e.g. after aborts or
    # between a preemption and its resumption); tpu-inference answers it
    # with an empty output, as it should, and warns anyway.
    "vllm.tpu_inference.runner.tpu_runner": (
        r"Should not schedule a request that does nothing",
    ),
    # At shutdown vLLM waits `--shutdown-timeout` (default 0) plus 5 s for
    # its engine process; on a busy CPU host JAX's teardown takes longer
    # and the kill is the normal end. Requests still running then are
    # ended as aborted (`serve/frontend/shutdown.py`), not lost.
    "vllm.v1.utils": (r"\[shutdown\] Process manager: force killing",),
    "vllm.distributed.parallel_state": (
        r"empty_host_cache\(\) only available in Pytorch",
    ),
    "vllm.platforms.interface": (r"Failed to import from vllm\._C",),
    "vllm.model_executor.model_loader": (
        r"Load format `runai_streamer` is already registered",
    ),
    "vllm.tokenizers.registry": (r"Using a slow tokenizer",),
    "vllm.config.vllm": (
        r"Inductor compilation was disabled by user settings",
        r"Model Runner V2 requires Triton",
    ),
    "torch.utils.cpp_extension": (r"No CUDA runtime is found",),
    # vLLM warms up chat rendering at start-up; an artifact exported without
    # a chat template is a choice, not a failure (chat requests get a 400
    # that says how to add one).
    "vllm.renderers.base": (r"Chat template warmup failed.*NoChatTemplateError",),
    # Every LoRA request warns once that per-adapter tokenizers are
    # deprecated; a keras-vllm adapter is served with its base's tokenizer.
    "vllm.v1.engine.input_processor": (
        r"deprecated support for supporting different tokenizers",
    ),
    # keras-vllm writes `temperature` for greedy samplers on purpose: vLLM
    # reads it as the default (0 = greedy); transformers only warns.
    "transformers.generation.configuration_utils": (
        r"generation flags are not valid",
    ),
}

# Loggers on which vLLM repeats, in its own words, a request it fails on a
# keras-vllm error ("Chat template rejected the request: %s"): keras-vllm
# logs each refusal itself, once (`serve/frontend/refusal_log.py`).
ECHOES_OF_REFUSALS = ("vllm.renderers.hf",)

# Set for vLLM's processes in quiet serving, unless the user set them.
QUIET_ENVIRONMENT = {
    envs.LOGGING_LEVEL.name: "WARNING",
    envs.TRANSFORMERS_VERBOSITY.name: "error",
}


class _DropFalseAlarms(logging.Filter):
    def __init__(self, patterns):
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record):
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is not ours to hide
            return True
        error = record.exc_info[1] if record.exc_info else None
        seen = set()
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            text += " " + type(error).__name__
            error = error.__cause__ or error.__context__
        return not self.pattern.search(text)


class _DropEchoedRefusals(logging.Filter):
    def filter(self, record):
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, KerasVllmError) for arg in args)


def install_false_alarm_filters():
    """Drops the records in `FALSE_ALARMS`, and vLLM's echoes of
    keras-vllm's refusals (`ECHOES_OF_REFUSALS`), unless verbose was
    requested.

    Safe to call often and before the noisy modules are imported (their
    loggers are the same objects `logging.getLogger` returns now).
    """
    if envs.VERBOSE.get():
        return
    for name, patterns in FALSE_ALARMS.items():
        target = logging.getLogger(name)
        if not any(isinstance(f, _DropFalseAlarms) for f in target.filters):
            target.addFilter(_DropFalseAlarms(patterns))
    for name in ECHOES_OF_REFUSALS:
        target = logging.getLogger(name)
        if not any(isinstance(f, _DropEchoedRefusals) for f in target.filters):
            target.addFilter(_DropEchoedRefusals())


def quiet_environment():
    """The environment changes for quiet serving ({} when verbose)."""
    if envs.VERBOSE.get():
        return {}
    return {
        key: value
        for key, value in QUIET_ENVIRONMENT.items()
        if not os.environ.get(key)
    }


def apply_quiet_environment():
    """Makes this process and the processes it starts quiet, for good (a
    command-line process); returns the environment it set."""
    changes = quiet_environment()
    os.environ.update(changes)
    if envs.LOGGING_LEVEL.name in changes:
        # vLLM reads the variable when it is first imported; an already
        # imported vLLM gets the level directly.
        logging.getLogger("vllm").setLevel(logging.WARNING)
    return changes


@contextlib.contextmanager
def serving_logs(verbose):
    """Quiet serving (or, verbose, every log line) while an engine starts.

    The engine's processes keep the environment they started with; this
    process gets its environment and vLLM's log level back afterwards.

    Args:
        verbose: True shows every line (here and in the engine's
            processes); anything else makes serving quiet.
    """
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    if verbose is True:
        changes = {} if envs.VERBOSE.get() else {VERBOSE_ENV: "1"}
        os.environ.update(changes)
    else:
        changes = apply_quiet_environment()
    try:
        yield
    finally:
        for key in changes:
            os.environ.pop(key, None)
        vllm_logger.setLevel(level)

def show_info_when_verbose():
    """With `KERAS_VLLM_VERBOSE=1`, prints keras-vllm's INFO lines (phases,
    what is served) in processes where nobody configured logging, such as
    vLLM's engine processes."""
    if not envs.VERBOSE.get():
        return
    target = logging.getLogger("keras_vllm")
    if target.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    target.addHandler(handler)
    target.setLevel(logging.INFO)


# Gloo prints this to stdout (std::cout, no setting turns it off) for every
# process group it connects; vLLM makes one per parallel dimension.
_GLOO_CONNECTED = re.compile(
    rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. Expected "
    rb"number of connected peer ranks is : (\d+)\s*"
)


@contextlib.contextmanager
def _without_native_lines(fd, dropped):
    """Captures file descriptor `fd` (1 or 2) during the block and writes
    back every line but those `dropped(line)` matches: C++ libraries print
    there directly, past Python's logging (anything else printed meanwhile
    still shows, after the block)."""
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), fd)
        try:
            yield
        finally:
            stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(
                line
                for line in captured.read().splitlines(keepends=True)
                if not dropped(line)
            )
            if kept:
                os.write(fd, kept)


def _without_gloo_connected_lines():
    """Drops Gloo's "all peers connected" lines from file descriptor 1 while
    a Gloo group connects (a missing peer's line still shows)."""
    return _without_native_lines(1, _gloo_all_connected)


# SentencePiece's C++ INFO line when a model without a normalization table
# loads (tensorflow-text's copy prints it, on stderr, for every tiny or
# Gemma-style vocabulary): `normalizer.cc(51) LOG(INFO) precompiled_charsmap
# is empty. use identity normalization.`
_SENTENCEPIECE_INFO = re.compile(rb"normalizer\.cc\(\d+\) LOG\(INFO\) .*\n?")


def without_sentencepiece_info():
    """A context manager that keeps SentencePiece's C++ INFO lines out of
    the output while a tokenizer loads, unless verbose (warnings, errors
    and every other line still show)."""
    if envs.VERBOSE.get():
        return contextlib.nullcontext()
    return _without_native_lines(
        2, lambda line: _SENTENCEPIECE_INFO.fullmatch(line) is not None
    )


def _gloo_all_connected(line):
    match = _GLOO_CONNECTED.fullmatch(line)
    return match is not None and match.group(1) == match.group(2)


def drop_gloo_connected_lines():
    """Keeps Gloo's "Rank 0 is connected to 0 peer ranks" lines (seven per
    engine start) out of the output unless verbose was requested.

    Wraps `torch.distributed.init_process_group` and `new_group` for the
    Gloo backend only, the way vLLM already wraps its own CPU groups
    (`vllm.utils.system_utils.suppress_stdout`, pinned 0.32.0), but keeping
    every other line. Safe to call more than once.
    """
    if envs.VERBOSE.get():
        return
    import torch.distributed as dist

    for name in ("init_process_group", "new_group"):
        patching.replace(dist, name, _quiet_for_gloo)


def _quiet_for_gloo(original):

    @functools.wraps(original)
    def quiet(*args, **kwargs):
        backend = kwargs.get("backend")
        if backend is None and args and original.__name__ == (
            "init_process_group"
        ):
            backend = args[0]
        if str(backend).lower() != "gloo":
            return original(*args, **kwargs)
        with _without_gloo_connected_lines():
            return original(*args, **kwargs)

    return quiet
