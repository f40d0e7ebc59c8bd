"""`keras-vllm serve`: `vllm serve` on an artifact, with its defaults.

Kept apart from `cli.py` (which stays the parser and the other commands).
"""

import os
import sys

from keras_vllm import cli_reload
from keras_vllm import cli_signing
from keras_vllm import envs


def serve_command(path, extra):
    """The `vllm serve` command line for an artifact."""
    from keras_vllm import format as fmt
    from keras_vllm.engine import serving_defaults

    manifest = fmt.open_artifact(path).manifest
    defaults = serving_defaults(os.path.abspath(path), manifest, {})
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
        cli_signing.check_trust(args)
        envs.PUBLIC_KEY.set(os.path.abspath(args.public_key))
    reload_arguments = cli_reload.serve_arguments(args)
    command = serve_command(args.artifact, args.vllm_args) + reload_arguments
    if args.preset is not None:
        use_preset(args.artifact, args.preset)
    print(" ".join(command), flush=True)
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


def use_preset(path, preset):
    """Checks a `--preset` override and hands it to `vllm serve`'s engine
    process (through `KERAS_VLLM_PRESET`)."""
    from keras_vllm import format as fmt
    from keras_vllm import presets
    from keras_vllm.engine_settings import resolve_preset

    preset = resolve_preset(preset)
    recorded = fmt.open_artifact(path).manifest.get("preset")
    if recorded is not None and recorded["files"]:
        presets.check_available(preset, sorted(recorded["files"]))
    envs.PRESET.set(preset)
