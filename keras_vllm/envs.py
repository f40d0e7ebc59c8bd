"""Every environment variable keras-vllm reads, in one place.

Each variable is declared once (name, accepted values, default, meaning,
who reads it) and read through an accessor at call time, so a value set
after import (or by a test's `monkeypatch`) is seen. A malformed value
raises `keras_vllm.errors.ConfigurationError` (a `ValueError`) that names
the variable and what it accepts; an empty value counts as unset.

This module is a leaf that imports only the standard library: vLLM's
processes import it before JAX starts.

Example:

```python
from keras_vllm import envs

if envs.VERBOSE.get():
    ...
envs.DEVICE.name  # "KERAS_VLLM_DEVICE"
```
"""

import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(value):
    value = value.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError


def _choice(*choices):
    def parse(value):
        if value.lower() not in choices:
            raise ValueError
        return value.lower()

    return parse


def _positive(cast):
    def parse(value):
        try:
            number = cast(float(value))
        except (OverflowError, ValueError):
            raise ValueError from None
        if not number > 0:  # also refuses NaN
            raise ValueError
        return number

    return parse


def _progress(value):
    value = value.lower()
    if value in ("auto", "lines"):
        return value
    return _flag(value)


def _text(value):
    return value


class Variable:
    """One environment variable keras-vllm reads.

    Args:
        name: the variable's name.
        accepts: the values it accepts, as the docs and errors say them.
        default: what an unset (or empty) variable means.
        meaning: one line saying what it does.
        readers: the modules that read or set it.
        parse: turns the stripped text into a value; raises `ValueError`
            when the text is not one of `accepts`.
    """

    __slots__ = ("name", "accepts", "default", "meaning", "readers", "_parse")

    def __init__(self, name, accepts, default, meaning, readers, parse=_text):
        self.name = name
        self.accepts = accepts
        self.default = default
        self.meaning = meaning
        self.readers = readers
        self._parse = parse

    def raw(self):
        """The variable's stripped text, or None when unset or empty."""
        return os.environ.get(self.name, "").strip() or None

    def get(self):
        """The parsed value now, or `default` when unset.

        Raises:
            ConfigurationError: the value is not one of `accepts` (a
                `ValueError`).
        """
        text = self.raw()
        if text is None:
            return self.default
        try:
            return self._parse(text)
        except ValueError:
            # Imported only here: importing this module stays stdlib-only.
            from keras_vllm.errors import ConfigurationError

            raise ConfigurationError(
                f"{self.name}={os.environ[self.name]!r} is not valid; use "
                f"{self.accepts}, or leave it unset. {self.meaning}"
            ) from None

    def set(self, value):
        """Sets the variable for this process and those it starts."""
        os.environ[self.name] = str(value)

    def setdefault(self, value):
        """Sets the variable unless it is set (even to an empty value)."""
        os.environ.setdefault(self.name, str(value))

    def __repr__(self):
        return f"Variable({self.name!r})"


# keras-vllm's own variables.
DEVICE = Variable(
    "KERAS_VLLM_DEVICE", "'cpu' or 'tpu'", None,
    "Forces the CPU backend on (cpu) or off (tpu); unset detects a TPU.",
    "cpu/detect.py",
    _choice("cpu", "tpu"),
)
CPU_MEMORY_GB = Variable(
    "KERAS_VLLM_CPU_MEMORY_GB", "a positive number", 4.0,
    "Fake HBM of the CPU host in GiB, shared by its JAX CPU devices; vLLM "
    "sizes the KV cache from it.",
    "cpu/memory.py",
    _positive(float),
)
CPU_ASYNC_SCHEDULING = Variable(
    "KERAS_VLLM_CPU_ASYNC_SCHEDULING", "1/true/yes/on or 0/false/no/off", True,
    "0 turns vLLM's async scheduling off on CPU (default: vLLM's choice).",
    "cpu/patches.py",
    _flag,
)
LAZY_WARM_START = Variable(
    "KERAS_VLLM_LAZY_WARM_START", "1/true/yes/on or 0/false/no/off", True,
    "0 precompiles every program at each start, also when the compile "
    "cache holds them all (default: such a start loads them on use).",
    "serve/worker/warm_start.py",
    _flag,
)
VERBOSE = Variable(
    "KERAS_VLLM_VERBOSE", "1/true/yes/on or 0/false/no/off", False,
    "1 shows vLLM's full log, false alarms and keras-vllm's INFO lines.",
    "logs.py, serve/engine/engine.py; set by cli/commands.py (-v)",
    _flag,
)
PROGRESS = Variable(
    "KERAS_VLLM_PROGRESS", "'auto', 'lines', 1 or 0", "auto",
    "The default `verbose` of progress lines (see keras_vllm/progress.py).",
    "progress.py",
    _progress,
)
ENGINE_PROGRESS = Variable(
    "KERAS_VLLM_ENGINE_PROGRESS", "'lines'", None,
    "lines: vLLM's engine process prints one line per loading phase.",
    "serve/worker/model.py; set by cli/serve.py",
    _choice("lines"),
)
MOE_EXPERTS = Variable(
    "KERAS_VLLM_MOE_EXPERTS", "'routed' or 'dense'", "routed",
    "dense serves mixture-of-experts blocks as KerasHub computes them "
    "(every expert for every token), for comparison; routed computes each "
    "token's top-k experts only.",
    "layers/common/routed_experts.py, bench/moe.py",
    _choice("routed", "dense"),
)
MAX_PARAMETERS = Variable(
    "KERAS_VLLM_MAX_PARAMETERS", "a positive integer (1e10 is fine)", 1 << 34,
    "The largest backbone (parameters estimated from its config) loaded.",
    "format/configs.py",
    _positive(int),
)
PRESET = Variable(
    "KERAS_VLLM_PRESET", "a preset handle or local preset directory", None,
    "Where a delta artifact's preset is loaded from instead of the handle "
    "its manifest records (its files must still hash to the recorded "
    "values); for plain `vllm serve`, set by `keras-vllm serve --preset`.",
    "serve/worker/model.py, serve/preflight.py, serve/frontend/reload.py; "
    "set by serve/engine/engine.py and cli/serve.py",
)
PUBLIC_KEY = Variable(
    "KERAS_VLLM_PUBLIC_KEY",
    "the path of a PEM public key (EC P-256/384/521)",
    None,
    "Set: every artifact read in this process must carry a signature "
    "(model.sig) by this key, checked before any other file is read; for "
    "plain `vllm serve`, set by `keras-vllm serve --public-key`.",
    "signing/policy.py (load/opening.py, serve/frontend/refusals.py, the tokenizer "
    "adapter, serve/worker/model.py, serve/frontend/reload.py); set by "
    "serve/engine/engine.py and cli/serve.py",
)
ENGINE_START = Variable(
    "KERAS_VLLM_ENGINE_START", "'forkserver' or 'spawn'", "forkserver",
    "How vLLM's engine process starts when JAX already runs in the caller: "
    "forked from a fork server that imported vLLM once, or spawned fresh.",
    "serve/process/start.py",
    _choice("forkserver", "spawn"),
)
SERVING_TENSORFLOW = Variable(
    "KERAS_VLLM_SERVING_TENSORFLOW", "1/true/yes/on or 0/false/no/off", False,
    "1 lets keras-hub import TensorFlow in serving processes too (default: "
    "a serving process that imports keras-hub first does it without).",
    "hub/imports.py",
    _flag,
)
UNAPPLIED_SAMPLING = Variable(
    "KERAS_VLLM_UNAPPLIED_SAMPLING", "'refuse' or 'ignore'", "refuse",
    "What a keras-vllm engine does with a request that sets a sampling "
    "parameter vLLM's TPU backend does not apply (penalties, min_p, "
    "logit_bias, bad_words): refuse it, or serve it without the parameter.",
    "serve/frontend/sampling.py",
    _choice("refuse", "ignore"),
)
# Other tools' variables that keras-vllm reads or sets a default for.
JAX_PLATFORMS = Variable(
    "JAX_PLATFORMS", "JAX's platform list", None,
    "cpu: the CPU backend, tpu/proxy: the TPU; set where JAX has no TPU/GPU.",
    "cpu/detect.py, cpu/devices.py, _env.py",
)
TPU_USING_PATHWAYS = Variable(
    "VLLM_TPU_USING_PATHWAYS", "vLLM's flag", None,
    "Set (not 0/false): remote TPUs through Pathways, not the CPU backend.",
    "cpu/detect.py",
)
TPU_ACCELERATOR_TYPE = Variable(
    "TPU_ACCELERATOR_TYPE", "any value", None,
    "Set on Cloud TPU VMs and GKE TPU pods: a TPU host.",
    "cpu/detect.py",
)
TPU_MULTIHOST_BACKEND = Variable(
    "TPU_MULTIHOST_BACKEND", "'ray' or empty", None,
    "tpu-inference's: ray serves over vLLM's Ray executor across hosts; on "
    "a CPU host keras-vllm then joins the workers into one JAX program.",
    "cpu/patches.py (cpu/multihost.py)",
)
TPU_MULTIPROCESS_DP = Variable(
    "TPU_MULTIPROCESS_DP", "0 or 1", None,
    "tpu-inference's: 1 runs vLLM's data-parallel engines (one engine core "
    "per replica), 0 one engine over a (data, model) mesh. keras-vllm sets "
    "0 unless the user set it, so `vllm serve` serves data parallelism as "
    "`KerasVllmEngine` does (tpu-inference picks 1 there by itself).",
    "_env.py",
)
CI = Variable(
    "CI", "any value", None,
    "Set: progress lines are not drawn with verbose='auto'.",
    "progress.py",
)
TERM = Variable(
    "TERM", "the terminal type", None,
    "dumb: progress lines are not drawn with verbose='auto'.",
    "progress.py",
)
KERAS_BACKEND = Variable(
    "KERAS_BACKEND", "Keras' backend name", "jax",
    "Defaulted to jax before Keras is imported.",
    "_env.py, serve/plugin.py, testing/",
)
KERAS_NNX_ENABLED = Variable(
    "KERAS_NNX_ENABLED", "Keras' flag", "true",
    "Defaulted to true before Keras is imported.",
    "_env.py, testing/",
)
WORKER_MULTIPROC_METHOD = Variable(
    "VLLM_WORKER_MULTIPROC_METHOD", "fork or spawn", None,
    "Set to spawn when JAX already runs in the process starting an engine.",
    "serve/process/start.py",
)
LOGGING_LEVEL = Variable(
    "VLLM_LOGGING_LEVEL", "a logging level", None,
    "Set to WARNING for quiet serving unless the user set it.",
    "logs.py",
)
TRANSFORMERS_VERBOSITY = Variable(
    "TRANSFORMERS_VERBOSITY", "a transformers verbosity", None,
    "Set to error for quiet serving unless the user set it.",
    "logs.py",
)

RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY = Variable(
    "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY",
    "comma-separated prefixes",
    None,
    "vLLM's: KERAS_ is added, so that the KERAS_* variables (backend, NNX, "
    "keras-vllm's own) reach Ray workers on other hosts.",
    "serve/plugin.py",
)
XLA_FLAGS = Variable(
    "XLA_FLAGS", "XLA's flags", None,
    "On a CPU host, --xla_force_host_platform_device_count is raised to the "
    "devices a tensor-parallel engine needs before its process starts JAX.",
    "cpu/devices.py",
)
ENABLE_V1_MULTIPROCESSING = Variable(
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "0 or 1",
    True,
    "vLLM's: 0 runs the engine in the calling process (its JAX devices are "
    "then the caller's).",
    "cpu/patches.py, serve/process/start.py",
    parse=_flag,
)

COMPILATION_CACHE_DIR = Variable(
    "JAX_COMPILATION_CACHE_DIR", "a directory", None,
    "JAX's: where compiled programs are cached; keras-vllm sets vLLM's "
    "VLLM_XLA_CACHE_PATH in vLLM's processes unless this is set.",
    "serve/worker/compile_cache.py",
)
PERSISTENT_CACHE_MIN_COMPILE_TIME = Variable(
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "seconds", None,
    "JAX's: programs compiling faster are not cached (JAX's default 1 s); "
    "keras-vllm sets 0 in vLLM's processes unless this is set.",
    "serve/worker/compile_cache.py",
)

TF_ENABLE_ONEDNN_OPTS = Variable(
    "TF_ENABLE_ONEDNN_OPTS", "TensorFlow's flag", None,
    "Defaulted to 0 unless verbose: TensorFlow (imported by keras-hub for "
    "tokenizers only) then skips its oneDNN and absl start-up lines.",
    "_env.py",
)
TF_CPP_MIN_LOG_LEVEL = Variable(
    "TF_CPP_MIN_LOG_LEVEL", "0-3", None,
    "Defaulted to 1 unless verbose (as JAX does): no TensorFlow INFO lines.",
    "_env.py",
)
TF_ENABLED_DEVICE_TYPES = Variable(
    "TF_ENABLED_DEVICE_TYPES",
    "TensorFlow device types, comma-separated",
    None,
    "Defaulted to CPU unless verbose on hosts without an NVIDIA GPU: "
    "TensorFlow then does not call cuInit (its 'failed call to cuInit' line).",
    "_env.py",
)

# Every variable above, in declaration order.
VARIABLES = tuple(v for v in list(globals().values()) if isinstance(v, Variable))


def check_own():
    """Reads every `KERAS_VLLM_*` variable once, so that a malformed one is
    reported up front (the CLI does this before any work).

    Raises:
        ConfigurationError: naming the first malformed variable.
    """
    for variable in VARIABLES:
        if variable.name.startswith("KERAS_VLLM_"):
            variable.get()


def jax_platforms():
    """`JAX_PLATFORMS`, lowercased; `""` when unset or empty."""
    return (JAX_PLATFORMS.raw() or "").lower()


def tpu_using_pathways():
    """Whether `VLLM_TPU_USING_PATHWAYS` says the TPUs are remote."""
    return (TPU_USING_PATHWAYS.raw() or "0").lower() not in ("0", "false")


def tpu_accelerator_type():
    """`TPU_ACCELERATOR_TYPE`, or None when unset (not a TPU VM)."""
    return TPU_ACCELERATOR_TYPE.raw()


def in_ci():
    """Whether this looks like CI or a dumb terminal (no live drawing)."""
    return CI.raw() is not None or (TERM.raw() or "").lower() == "dumb"
