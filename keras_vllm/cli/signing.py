"""The signing parts of the `keras-vllm` command line.

    keras-vllm sign ARTIFACT --key KEY [--certificate CERT [--chain PEM]]
    --public-key PUB / --certificate-chain PEM    on verify, inspect, serve

Kept apart from `cli/commands.py`, which holds the parser and the other
commands.
"""


def add_sign_command(sub, parents, run):
    """Adds `keras-vllm sign` to the command parsers."""
    p = sub.add_parser(
        "sign",
        parents=parents,
        help="sign an artifact (model.sig) with a private key",
        description="Verify ARTIFACT's checksums, then sign every file in it "
        "(the manifest included) with OpenSSF model-signing; the signature "
        "is written to ARTIFACT/model.sig atomically (an existing one is "
        "replaced). Serving hosts check it with --public-key.",
    )
    p.add_argument("artifact")
    p.add_argument(
        "--key",
        required=True,
        help="PEM elliptic-curve private key (P-256/384/521)",
    )
    p.add_argument(
        "--certificate",
        default=None,
        help="PEM signing certificate for the key (certificate-based signing)",
    )
    p.add_argument(
        "--chain",
        action="append",
        default=[],
        metavar="PEM",
        help="with --certificate: the certificates that issued it, up to the "
        "root serving hosts trust (repeatable; at least one)",
    )
    p.set_defaults(func=run)
    return p


def add_trust_options(parser, chain=True):
    """`--public-key` (and `--certificate-chain`) on a reading command."""
    parser.add_argument(
        "--public-key",
        default=None,
        metavar="PUB",
        help="refuse the artifact unless it is signed by this PEM public key "
        "(default: KERAS_VLLM_PUBLIC_KEY)",
    )
    if chain:
        parser.add_argument(
            "--certificate-chain",
            action="append",
            default=None,
            metavar="PEM",
            help="refuse the artifact unless its signing certificate chains "
            "to these PEM root/intermediate certificates (repeatable)",
        )


def sign(args):
    """`keras-vllm sign`."""
    from keras_vllm import signing

    signer = signing.Signer(
        args.key, certificate=args.certificate, certificate_chain=args.chain
    )
    path = signing.sign_artifact(args.artifact, signer)
    how = f"key {signer.fingerprint}"
    if signer.certificate:
        how = f"certificate {signer.certificate}, {how}"
    print(f"signed {path} ({how})")
    return 0


def check_trust(args):
    """Verifies the signature `--public-key` / `--certificate-chain` asks
    for (before anything else is read) and prints a line; no-op without."""
    from keras_vllm import signing

    chain = getattr(args, "certificate_chain", None)
    if args.public_key is None and chain is None:
        return
    if args.public_key is not None and chain is not None:
        from keras_vllm.errors import SignatureError

        raise SignatureError(
            "Pass --public-key or --certificate-chain, not both."
        )
    required_by = "--public-key" if chain is None else "--certificate-chain"
    path = signing.verify_signature(
        args.artifact,
        args.public_key,
        certificate_chain=chain,
        required_by=required_by,
    )
    print(f"signature       ok ({path})", flush=True)
