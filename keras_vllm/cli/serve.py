"""`keras-vllm serve`: `vllm serve` on an artifact, with its defaults.

The artifact and the vLLM options are checked as every entry point checks
them (`keras_vllm.serve.preflight.check`) before `vllm serve` starts.
"""

import os
import sys

from keras_vllm.cli import reload
from keras_vllm.cli import signing
from keras_vllm import envs


def serve_command(path, extra, preset=None):
    """The `vllm serve` command line for an artifact.

    Raises:
        KerasVllmError: what `vllm serve` would refuse (see
            `keras_vllm.serve.preflight.check`), before it starts.
    """
    from keras_vllm import format as fmt
    from keras_vllm.serve import preflight

    plan = preflight.check(path, preflight.overrides_from_argv(extra), preset)
    defaults = plan.engine_kwargs
    command = [
        os.path.join(os.path.dirname(sys.executable), "vllm"),
        "serve",
        os.path.abspath(path),
        "--tokenizer-mode",
        fmt.TOKENIZER_MODE,
        "--dtype",
        defaults["dtype"],
        "--max-model-len",
        str(defaults["max_model_len"]),
    ]
    given = {a.split("=")[0] for a in extra if a.startswith("--")}
    for flag, value in (
        ("--max-num-seqs", defaults.get("max_num_seqs")),
        ("--max-num-batched-tokens", defaults.get("max_num_batched_tokens")),
    ):
        if value is not None and flag not in given:
            command += [flag, str(value)]
    if defaults.get("enable_prefix_caching") is False and (
        "--no-enable-prefix-caching" not in given
    ):
        command.append("--no-enable-prefix-caching")
    if defaults.get("disable_chunked_mm_input") and (
        "--disable-chunked-mm-input" not in given
    ):
        # An artifact that serves images (`preflight.serving_defaults`).
        command.append("--disable-chunked-mm-input")
    if defaults.get("async_scheduling") is False and (
        "--no-async-scheduling" not in given
    ):
        # Continue decode (`keras_vllm.serve.decode_steps`).
        command.append("--no-async-scheduling")
    return command + list(extra)


def take_option(argv, name):
    """Removes `name VALUE` / `name=VALUE` from `argv`; returns the value."""
    value = None
    rest = []
    items = iter(argv)
    for item in items:
        if item == name:
            value = next(items, None)
        elif item.startswith(name + "="):
            value = item.split("=", 1)[1]
        else:
            rest.append(item)
    argv[:] = rest
    return value


def serve(args):
    # `--preset` may follow the artifact, among vLLM's own options.
    args.preset = take_option(args.vllm_args, "--preset") or args.preset
    args.public_key = (
        take_option(args.vllm_args, "--public-key")
        or args.public_key
        or envs.PUBLIC_KEY.get()
    )
    if args.public_key is not None:
        # Checked here before the manifest is read, and by `vllm serve`'s
        # processes (its refusal check, engine and tokenizer) again.
        signing.check_trust(args)
        envs.PUBLIC_KEY.set(os.path.abspath(args.public_key))
    reload_arguments = reload.serve_arguments(args)
    command = serve_command(args.artifact, args.vllm_args, args.preset)
    command += reload_arguments
    if args.preset is not None:
        # For `vllm serve`'s engine process.
        from keras_vllm.serve.preflight import resolve_preset

        envs.PRESET.set(resolve_preset(args.preset))
    from keras_vllm.serve.frontend import refusal_log

    # The server's log starts with this line: no API key in it.
    print(" ".join(refusal_log.redact_argv(command)), flush=True)
    if not args.quiet:
        envs.ENGINE_PROGRESS.set("lines")
    if not args.verbose:
        print(
            "keras-vllm: vLLM logs warnings and errors only (-v for all); "
            "the server is ready when Uvicorn says 'Application startup "
            "complete'.",
            file=sys.stderr,
            flush=True,
        )
    os.execv(command[0], command)
