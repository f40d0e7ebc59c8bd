"""The `keras-vllm` command line.

    keras-vllm export PRESET OUT      export a preset (handle or directory)
    keras-vllm inspect ARTIFACT       print a readable summary
    keras-vllm verify ARTIFACT        check checksums and golden outputs
    keras-vllm sign ARTIFACT --key K  sign it (model.sig); --public-key PUB
                                      on verify/inspect/serve requires it
    keras-vllm serve ARTIFACT ...     `vllm serve` with the artifact's defaults
    keras-vllm reload URL ARTIFACT    new weights for a serve --enable-reload
    keras-vllm demo                   the whole handoff on a tiny model, offline
    keras-vllm bench [--quick] ...    the serving benchmark (keras_vllm.bench)

Exit codes: 0 success, 1 verification failed, 2 usage error, 3 the artifact
or model was refused (the message says why).
"""

import argparse
import logging
import sys

from keras_vllm.cli import reload as cli_reload
from keras_vllm.cli import serve as cli_serve
from keras_vllm.cli import signing as cli_signing
from keras_vllm import envs

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


def _export(args):
    import keras_vllm
    from keras_vllm.errors import ExportError

    from keras_vllm.export.capabilities import preset_causal_lm_class

    try:
        causal_lm = preset_causal_lm_class(args.preset).from_preset(
            args.preset, dtype=args.dtype
        )
    except Exception as e:  # keras-hub raises many types for a bad preset
        cause = " ".join(str(e).split())[:400]
        raise ExportError(
            f"keras-hub could not load '{args.preset}' "
            "(keras_hub.models.CausalLM.from_preset raised "
            f"{type(e).__name__}: {cause}). Pass a KerasHub preset, a "
            "Hugging Face checkpoint keras-hub converts (config.json, "
            "safetensors and the tokenizer files its converter reads), or "
            "a kaggle:// / hf:// handle."
        ) from None
    if args.sampler:
        causal_lm.compile(sampler=args.sampler)
    path = keras_vllm.export_vllm(
        causal_lm,
        args.out,
        preset=args.preset,
        weights=args.weights,
        overwrite=args.overwrite,
        chat_template=args.chat_template,
        signing_key=args.signing_key,
    )
    from keras_vllm import format as fmt
    from keras_vllm.cli.inspect_artifact import weights_line

    print(f"exported {path}")
    print(f"weights  {weights_line(fmt.open_artifact(path).manifest)}")
    return EXIT_OK


def _inspect(args):
    from keras_vllm.cli.inspect_artifact import kv_cache_lines
    from keras_vllm.cli.inspect_artifact import summary
    from keras_vllm.cli.inspect_artifact import tensor_parallel_lines
    from keras_vllm.load.opening import open_verified

    cli_signing.check_trust(args)
    # Validated too (plain Python, no model is built): inspect is how a
    # serving team first looks at an artifact it was handed.
    opened = open_verified(
        args.artifact, verify=not args.no_verify, public_key=args.public_key
    )
    print(summary(opened))
    for line in kv_cache_lines(opened) + tensor_parallel_lines(opened):
        print(line)
    return EXIT_OK


def _verify(args):
    import keras_vllm
    from keras_vllm.load.keras_loader import check_golden
    from keras_vllm.load.opening import open_verified

    cli_signing.check_trust(args)
    opened = open_verified(
        args.artifact, verbose="auto", validate=False,
        public_key=args.public_key,
    )
    print(f"checksums       ok ({len(opened.manifest['files'])} files)")
    causal_lm = keras_vllm.load_causal_lm(
        args.artifact, verify=False, preset=args.preset,
        public_key=args.public_key,
    )
    failures = check_golden(causal_lm, opened)
    if failures:
        for prompt, want, got in failures:
            print(f"golden MISMATCH {prompt!r}: recorded {want}, got {got}")
        return EXIT_FAILED
    print("golden (keras)  ok")
    if args.engine:
        failures = _engine_golden(args)
        if failures:
            for prompt, want, got in failures:
                print(f"engine MISMATCH {prompt!r}: recorded {want}, got {got}")
            return EXIT_FAILED
        print("golden (vllm)   ok")
    return EXIT_OK


def _verbose(args):
    """`verbose` for the library calls: see `keras_vllm.progress`."""
    if args.verbose:
        return True
    return False if args.quiet else "auto"


def _engine_golden(args):
    from keras_vllm.serve.engine.engine import KerasVllmEngine

    with KerasVllmEngine.from_export(
        args.artifact, verbose=_verbose(args), preset=args.preset,
        public_key=args.public_key,
    ) as engine:
        return engine.check_golden()


def _demo(args):
    from keras_vllm.cli import demo

    return demo.run(
        family=args.family, workdir=args.workdir, steps=args.steps
    )


class _DemoFamilies:
    """`--family`'s choices, read from `keras_vllm.testing.FAMILIES` only
    when a family is checked or listed: that module imports Keras, which
    the other commands do not wait for."""

    def _names(self):
        from keras_vllm.testing import FAMILIES

        return FAMILIES

    def __contains__(self, name):
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


def _bench(args):
    # Imported here: the benchmark is the top layer, nothing else needs it.
    from keras_vllm.bench import run

    return run.main(args.bench_args)


def _output_options(default):
    """-v / -q, accepted before or after the command name."""
    options = argparse.ArgumentParser(add_help=False)
    noise = options.add_mutually_exclusive_group()
    noise.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="print every phase and all library logs, vLLM's included",
    )
    noise.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="no progress lines (they are drawn only on a terminal anyway)",
    )
    return options


def _preset_option(parser):
    parser.add_argument(
        "--preset",
        default=None,
        help="load a delta artifact's preset from here (a local copy or "
        "handle) instead of the recorded one; its files must match",
    )


def build_parser():
    # A command's copy defaults to SUPPRESS, so that it does not reset what
    # was given before the command name.
    output = _output_options(argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="keras-vllm",
        description="Export fine-tuned KerasHub CausalLMs and serve them on "
        "vLLM.",
        epilog="Exit codes: 0 ok, 1 verification failed, 2 usage error, "
        "3 refused (bad artifact or model; the message says why).",
        parents=[_output_options(False)],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "export",
        parents=[output],
        help="export a KerasHub preset (handle or local directory)",
        description="Load PRESET with keras_hub.models.CausalLM.from_preset "
        "and write an artifact to OUT.",
    )
    p.add_argument("preset", help="preset handle or local preset directory")
    p.add_argument("out", help="artifact directory to create")
    p.add_argument("--dtype", default=None, help="e.g. float32, bfloat16")
    p.add_argument(
        "--weights",
        default="auto",
        choices=["auto", "delta", "full", "preset"],
        help="which weights to store (default: auto)",
    )
    p.add_argument("--sampler", default=None, help="e.g. greedy, top_k")
    p.add_argument("--chat-template", default=None, help="Jinja text or file")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument(
        "--signing-key", default=None, help="sign it with this PEM private key"
    )
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "inspect", help="print a readable summary", parents=[output]
    )
    p.add_argument("artifact")
    p.add_argument(
        "--no-verify", action="store_true", help="skip checksum verification"
    )
    cli_signing.add_trust_options(p)
    p.set_defaults(func=_inspect)

    p = sub.add_parser(
        "verify",
        parents=[output],
        help="check checksums and replay the golden outputs",
        description="Verify every file's checksum, rebuild the model in "
        "Keras and replay the golden greedy outputs recorded at export. "
        "With --engine, also replay them through the vLLM engine.",
    )
    p.add_argument("artifact")
    p.add_argument("--engine", action="store_true", help="also run vLLM")
    _preset_option(p)
    cli_signing.add_trust_options(p)
    p.set_defaults(func=_verify)

    cli_signing.add_sign_command(sub, [output], cli_signing.sign)

    p = sub.add_parser(
        "serve",
        parents=[output],
        help="run `vllm serve` on an artifact with its defaults",
        description="Runs `vllm serve ARTIFACT` with the artifact's dtype, "
        "max length and tokenizer mode. Extra arguments go to vLLM, e.g. "
        "`keras-vllm serve out/ --port 8000`.",
    )
    p.add_argument("artifact")
    _preset_option(p)
    cli_signing.add_trust_options(p, chain=False)
    cli_reload.add_enable_option(p)
    p.add_argument("vllm_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cli_serve.serve)
    cli_reload.add_reload_command(sub, [output])

    p = sub.add_parser(
        "demo",
        parents=[output],
        help="fine-tune, export, serve and compare a tiny model, offline",
    )
    p.add_argument(
        "--family",
        default="llama3",
        choices=_DemoFamilies(),
        metavar="FAMILY",
        help="the tiny model's family (default: llama3): "
        "one of keras_vllm.testing.FAMILIES",
    )
    p.add_argument("--workdir", default=None, help="default: a temp dir")
    p.add_argument("--steps", type=int, default=100)
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "bench",
        help="run the A/B/C-seed/C serving benchmark (keras_vllm.bench)",
        description="Runs keras_vllm.bench; arguments go to it (e.g. "
        "--quick, --model medium, --out FILE). See docs/benchmarks.md.",
        add_help=False,  # `keras-vllm bench --help` shows the benchmark's
    )
    p.set_defaults(func=_bench)  # its arguments: see main()
    return parser


def main(argv=None):
    """Entry point of the `keras-vllm` command."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = extra  # everything goes to the benchmark
    elif extra:
        parser.error("unrecognized arguments: " + " ".join(extra))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(message)s",
    )
    if args.quiet:
        # -q: results and errors only (not, e.g., the CPU-backend notice).
        logging.getLogger("keras_vllm").setLevel(logging.ERROR)
    from keras_vllm.errors import KerasVllmError

    try:
        return _run(args)
    except KerasVllmError as e:
        # Refusals (a bad artifact, model or setting, a malformed
        # KERAS_VLLM_* variable) are one line, not a traceback.
        print(f"keras-vllm: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_REFUSED


def _run(args):
    from keras_vllm import _env  # noqa: F401
    from keras_vllm import logs

    envs.check_own()
    if args.verbose:
        envs.VERBOSE.set("1")
    else:
        # This process is ours: quiet from the start (TensorFlow and vLLM
        # read their settings when imported).
        logs.apply_quiet_environment()

    if args.command in ("export", "inspect") or (
        args.command == "verify" and not args.engine
    ):
        from keras_vllm.hub import imports

        imports.without_serving_stack()
    from keras_vllm import progress

    with progress.verbosity(_verbose(args)):
        return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
