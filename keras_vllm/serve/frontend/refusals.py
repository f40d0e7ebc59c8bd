"""One-line refusals for plain `vllm serve DIR` of a directory keras-vllm
recognizes but cannot serve (empty, a KerasHub preset, a truncated or
tampered artifact, a delta whose preset is not here; with `KERAS_VLLM_PUBLIC_KEY`, any directory without a
valid signature by that key).

vLLM loads general plugins while it builds its command-line parser, before
it reads the model's config, so `keras_vllm.serve.plugin.register` can refuse such
a directory in a second instead of vLLM's traceback half a minute later.
Directories vLLM serves natively (a Hugging Face checkpoint: `config.json`
with another `model_type`) are left to vLLM. A refusal is one line on
stderr, `WARNING keras-vllm refused vllm serve: ErrorClass: message` (the
error and words of every entry point; `refusal_log`), and exit status 3.
"""

import json
import multiprocessing
import os
import sys

from keras_vllm import format as fmt
from keras_vllm.serve import preflight
from keras_vllm.serve.frontend import refusal_log

EXIT_REFUSED = 3  # as `keras-vllm` (cli/commands.py)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def refusal(path, argv=()):
    """Why `vllm serve path` cannot serve a directory, or None.

    Args:
        path: a local directory.
        argv: the `vllm serve` command line.

    Returns:
        The one-line message (`keras-vllm: ErrorClass: ...`, as every
        entry point words it), or None (see `refusal_error`).
    """
    error = refusal_error(path, argv)
    if error is None:
        return None
    return f"keras-vllm: {type(error).__name__}: {error}"


def refusal_error(path, argv=()):
    """The `KerasVllmError` that keeps `vllm serve path` from serving a
    directory, or None.

    A keras-vllm artifact gets the checks every entry point runs
    (`keras_vllm.serve.preflight.check`), with the options of `argv` it
    judges (`--tensor-parallel-size`, `--max-model-len`, ...).

    Args:
        path: a local directory.
        argv: the `vllm serve` command line.

    Returns:
        The error, or None when the directory is a loadable keras-vllm
        artifact or is not one keras-vllm should judge (an unsigned
        directory is always judged under a signature policy).
    """
    from keras_vllm.errors import ArtifactError
    from keras_vllm.errors import KerasVllmError
    from keras_vllm.errors import ServingError
    from keras_vllm.signing import require_signature

    if os.listdir(path):
        # With `KERAS_VLLM_PUBLIC_KEY` set, nothing unsigned is served, not
        # even a directory vLLM would load natively: an artifact swapped
        # for a Hugging Face checkpoint must not bypass the policy. Checked
        # before any file is parsed.
        try:
            require_signature(path)
        except KerasVllmError as e:
            return e
    config = _read_json(os.path.join(path, "config.json"))
    config = config if isinstance(config, dict) else {}
    if os.path.isfile(os.path.join(path, fmt.MANIFEST_FILE)) or (
        config.get("model_type") == fmt.MODEL_TYPE
    ):
        try:
            # A delta's preset (or an adapter's base) that is not here, or a
            # tensor-parallel size the heads cannot split over, would fail in
            # the engine process, after vLLM's start, in a traceback.
            plan = preflight.check(path, preflight.overrides_from_argv(argv))
        except KerasVllmError as e:
            return e
        if plan.engine_kwargs.get("disable_chunked_mm_input") and not all(
            a in argv for a in ("--disable-chunked-mm-input",
                                "--no-enable-prefix-caching")
        ):
            # An artifact that serves images (`preflight.serving_defaults`).
            return ServingError(
                f"'{path}' serves images: an image's placeholders attend to "
                "the whole image, so serve it with `--disable-chunked-mm-input "
                "--no-enable-prefix-caching` (`keras-vllm serve` adds both)."
            )
        if plan.engine_kwargs.get("async_scheduling") is False and (
            "--no-async-scheduling" not in argv
        ):
            # Continue decode (`keras_vllm.serve.decode_steps`).
            return ServingError(
                f"'{path}' with enable_continue_decode needs asynchronous "
                "scheduling off (with it, tpu-inference 0.32 decodes the "
                "wrong tokens): add `--no-async-scheduling` (`keras-vllm "
                "serve` adds it)."
            )
        if plan.engine_kwargs.get("enable_prefix_caching") is False and (
            "--no-enable-prefix-caching" not in argv
        ):
            # vLLM's own default would turn it on.
            return ServingError(fmt.no_prefix_caching_message(path))
        return None
    registered = str(config.get("registered_name", ""))
    if os.path.isfile(os.path.join(path, "metadata.json")) and (
        registered.startswith("keras_hub")
    ):
        return ArtifactError(
            f"{path} is a KerasHub preset ({registered}), not a keras-vllm "
            f"artifact. Export it first: `keras-vllm export {path} OUT`, "
            "then `vllm serve OUT`."
        )
    if not os.listdir(path):
        return ArtifactError(
            f"{path} is empty: not a keras-vllm artifact (no "
            f"{fmt.MANIFEST_FILE}) nor a model vLLM can load. Export a model "
            "with `keras-vllm export PRESET OUT` or "
            "`causal_lm.export_vllm(OUT)`."
        )
    return None


def model_directory(argv):
    """The local directory `vllm serve` was asked to serve, or None."""
    if len(argv) < 3 or os.path.basename(argv[0]) != "vllm":
        return None
    if argv[1] != "serve":
        return None
    model = preflight.option_value(argv, ("--model",))
    if model is None and not argv[2].startswith("-"):
        model = argv[2]
    return model if model and os.path.isdir(model) else None


def refuse_unservable_directory():
    """Exits `vllm serve DIR` with keras-vllm's message (one WARNING line,
    `refusal_log`) when DIR cannot be served (see `refusal_error`); does
    nothing in any other process."""
    if multiprocessing.parent_process() is not None:
        return  # vLLM's own children inherit argv; the parent checked
    path = model_directory(sys.argv)
    if path is None:
        return
    error = refusal_error(path, sys.argv)
    if error is not None:
        refusal_log.refused(error, route="vllm serve")
        raise SystemExit(EXIT_REFUSED)
