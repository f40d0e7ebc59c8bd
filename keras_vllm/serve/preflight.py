"""What vLLM is told for an artifact, and every refusal before it starts.

The three ways to serve an artifact run `check()`, so they refuse the same
artifacts with the same words, before vLLM starts (and before its memory
profiling run):

- `KerasVllmEngine.from_export(path)` (`deep=True`: also the classes and
  the tokenizer, which it loads in this process anyway);
- `keras-vllm serve PATH [vLLM options]`, before it hands over to
  `vllm serve`;
- plain `vllm serve PATH [options]`, from keras-vllm's vLLM plugin while vLLM
  builds its parser (`serve/frontend/refusals.py`): about a second, no JAX.

It returns a `Plan`: the opened artifact, the `vllm.LLM` keyword arguments
before the caller's own (`serving_defaults`), and the preset a delta loads
from; `for_engine` hands the settings vLLM's engine processes read from
variables.
"""

import contextlib
import dataclasses
import os

from keras_vllm import envs
from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.errors import ServingError
from keras_vllm.format import assistant as assistant_format
from keras_vllm.serve import decode_steps
from keras_vllm.serve import speculation

# vLLM needs room for at least one full sequence; tiny CPU models need far
# less than vLLM's GPU-oriented defaults.
_DEFAULT_MAX_NUM_SEQS = 64
# On a CPU host (tests, laptops) every start compiles one program per token
# bucket (16 ... max_num_batched_tokens) and request bucket (8 ...
# max_num_seqs): 6 x 2 programs here instead of 8 x 4 start in well under
# half the time, and a CPU serves no more requests per step usefully.
_CPU_MAX_NUM_SEQS = 16
_CPU_MAX_NUM_BATCHED_TOKENS = 512


@dataclasses.dataclass
class Plan:
    """An artifact checked for serving.

    Attributes:
        artifact: the opened, verified `keras_vllm.format.Artifact`.
        engine_kwargs: `vllm.LLM` keyword arguments, the caller's included.
        preset: the resolved preset a delta loads from, or None.
    """

    artifact: object
    engine_kwargs: dict
    preset: object = None

    @property
    def path(self):
        return self.artifact.path

    @property
    def manifest(self):
        return self.artifact.manifest


def check(path, overrides=None, preset=None, public_key=None, deep=False,
          verbose=False):
    """Every check an artifact passes before vLLM starts on it.

    Args:
        path: the artifact directory.
        overrides: `vllm.LLM` keyword arguments given by the caller
            (`tensor_parallel_size`, `max_model_len`, `dtype`, ...).
        preset: where a delta's preset is (None: `KERAS_VLLM_PRESET`, else
            the handle the artifact records).
        public_key: the key the artifact must be signed by (None:
            `KERAS_VLLM_PUBLIC_KEY`; unset: none).
        deep: also resolve every class against the allowlist and load the
            tokenizer (replaying its recorded probes): imports keras-hub.
        verbose: progress of the hashing (see `keras_vllm.progress`).

    Returns:
        A `Plan`.

    Raises:
        KerasVllmError: (a subclass) naming what is wrong and what to do.

    Example:

    ```python
    plan = preflight.check("exports/tuned", {"tensor_parallel_size": 2})
    vllm.LLM(**plan.engine_kwargs)
    ```
    """
    from keras_vllm.load import keras_loader
    from keras_vllm.load.opening import open_verified

    path = os.path.abspath(os.fspath(path))
    if assistant_format.is_assistant(path):
        raise ServingError(
            f"'{path}' is an assistant artifact (a speculative drafter): it "
            "drafts for the target it was exported for and serves nothing "
            "on its own. Serve the target with speculative_config="
            f'{{"method": "mtp", "model": "{path}", '
            '"num_speculative_tokens": 3}.'
        )
    opened = open_verified(
        path, verbose=verbose, validate=False, public_key=public_key
    )
    with progress.phase("checking the artifact", verbose=verbose):
        opened.validate()
        kwargs = serving_defaults(opened, overrides or {})
        preset = resolve_preset(preset)
        keras_loader.check_sources(opened, preset)
        if deep:
            keras_loader.resolve_classes(opened.manifest)
            keras_loader.load_tokenizer(opened)
    return Plan(opened, kwargs, preset)


# `vllm serve` options that `check()` judges, as `vllm.LLM` arguments.
_SERVE_OPTIONS = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "data_parallel_size": ("--data-parallel-size", "-dp"),
    "max_model_len": ("--max-model-len",),
    "dtype": ("--dtype",),
    "additional_config": ("--additional-config",),
}
# `vllm serve` switches that `check()` judges (True when given).
_SERVE_SWITCHES = {
    "enable_lora": ("--enable-lora",),
    "enable_prefix_caching": ("--enable-prefix-caching",),
    "async_scheduling": ("--async-scheduling",),
}
# Switches that turn a setting off (False when given).
_SERVE_OFF_SWITCHES = {
    "enable_prefix_caching": ("--no-enable-prefix-caching",),
    "async_scheduling": ("--no-async-scheduling",),
}


def overrides_from_argv(argv):
    """The `vllm serve` options of `argv` that `check()` judges, as
    `vllm.LLM` keyword arguments (`--speculative-config` and its spellings
    as `speculative_config`, see `keras_vllm.serve.speculation`)."""
    found = {}
    speculative = speculation.from_argv(argv)
    if speculative is not None:
        found["speculative_config"] = speculative
    for key, names in _SERVE_OPTIONS.items():
        value = option_value(argv, names)
        if value is not None:
            found[key] = value
    for key, names in _SERVE_SWITCHES.items():
        if any(arg in names for arg in argv):
            found[key] = True
    for key, names in _SERVE_OFF_SWITCHES.items():
        if any(arg in names for arg in argv):
            found[key] = False
    return found


def option_value(argv, names):
    """The value of the last `--name VALUE` / `--name=VALUE` in `argv` (the
    last one wins, as in vLLM's parser), or None."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def serving_defaults(artifact, overrides):
    """The `vllm.LLM` keyword arguments for an artifact, with `overrides`.

    Args:
        artifact: an opened `keras_vllm.format.Artifact`.
        overrides: the caller's `vllm.LLM` keyword arguments.

    Raises:
        ServingError: for settings the artifact cannot serve.
    """
    from keras_vllm.cpu import detect
    from keras_vllm.load import data_parallel
    from keras_vllm.load import tensor_parallel
    from keras_vllm.serve.worker.extension import WORKER_EXTENSION

    path, manifest = artifact.path, artifact.manifest
    config_path = fmt.safe_join(path, fmt.CONFIG_FILE)
    if not manifest.get("servable", True) or not os.path.isfile(config_path):
        raise ServingError(
            f"'{path}' cannot be served on vLLM: "
            f"{manifest.get('unservable_reason') or 'it has no config.json'} "
            "(it was exported with `allow_unservable=True`)."
        )
    config = artifact.read_json(fmt.CONFIG_FILE)
    max_positions = int(config["max_position_embeddings"])
    kwargs = {
        "model": path,
        "tokenizer": path,
        "tokenizer_mode": fmt.TOKENIZER_MODE,
        "dtype": manifest["dtype"],
        "max_model_len": max_positions,
        "max_num_seqs": _DEFAULT_MAX_NUM_SEQS,
        "generation_config": "auto",
        "seed": 0,
        # keras-vllm's worker methods (`KerasVllmEngine.weights_layout()`).
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if detect.is_cpu_host():
        kwargs["max_num_seqs"] = _CPU_MAX_NUM_SEQS
        kwargs["max_num_batched_tokens"] = _CPU_MAX_NUM_BATCHED_TOKENS
    if not fmt.prefix_caching(manifest):
        if overrides.get("enable_prefix_caching"):
            raise ServingError(fmt.no_prefix_caching_message(path))
        kwargs["enable_prefix_caching"] = False
    if "image" in fmt.served_modalities(manifest):
        # An image's placeholders attend to the whole image, so they are
        # computed in one step (`layers/common/span_attention.py`); prefix
        # caching is off by default (its partial-image hits are untested).
        kwargs["disable_chunked_mm_input"] = True
        kwargs.setdefault("enable_prefix_caching", False)
    kwargs.update(overrides)
    max_len = kwargs.get("max_model_len")
    if max_len is not None and int(max_len) > max_positions:
        raise ServingError(
            f"max_model_len={max_len} exceeds the {max_positions} positions "
            f"this model was exported for. Use max_model_len <= "
            f"{max_positions}, or re-export with a larger "
            "`max_sequence_length` if the model supports it."
        )
    tensor_parallel.check_tensor_parallel(
        config, kwargs.get("tensor_parallel_size", 1), path
    )
    data_parallel.check_data_parallel(kwargs, path)
    speculation.check(artifact, kwargs)
    decode_steps.check(artifact, kwargs)
    dtype = kwargs.get("dtype")
    if dtype not in (None, "auto") and str(dtype) not in fmt.SUPPORTED_DTYPES:
        raise ServingError(
            f"dtype={dtype!r} cannot serve this artifact; use one of "
            f"{fmt.SUPPORTED_DTYPES}."
        )
    return kwargs


def resolve_preset(preset):
    """A preset override (`preset`, else `KERAS_VLLM_PRESET`), resolved."""
    from keras_vllm.hub import presets

    preset = preset if preset is not None else envs.PRESET.get()
    return None if preset is None else presets.resolve_handle(preset)


@contextlib.contextmanager
def for_engine(settings):
    """Hands settings to vLLM's engine processes through their variables:
    the preset override (`serve/worker/model.py` builds the model from it) and
    the signature policy (every reader there honours it)."""
    previous = {}
    for variable, value in settings.items():
        if value is not None:
            previous[variable] = variable.raw()
            variable.set(value)
    try:
        yield
    finally:
        for variable, value in previous.items():
            if value is None:
                os.environ.pop(variable.name, None)
            else:
                variable.set(value)
