"""Keys, certificates and the hashing settings keras-vllm signs with.

Keys and certificates are loaded here first, with `cryptography`, so that a
missing, encrypted or unsupported key is refused with a message naming the
file before any work is done (model-signing itself would raise a bare
`ValueError` or `AttributeError` later).
"""

import hashlib
import os

from keras_vllm import format as fmt
from keras_vllm.errors import SignatureError

# The curves model-signing's key and certificate signers accept.
SUPPORTED_CURVES = ("secp256r1", "secp384r1", "secp521r1")
_MAX_PEM_BYTES = 1 << 20


def hashing_config():
    """model-signing's hashing settings for an artifact directory.

    SHA-256 per file; every file is covered but the signature itself, git
    files included (model-signing ignores them by default), and links are
    refused. Signing and verifying use the same settings.
    """
    from model_signing import hashing

    return (
        hashing.Config()
        .use_file_serialization(
            hashing_algorithm="sha256", allow_symlinks=False
        )
        .set_ignored_paths(paths=[fmt.SIGNATURE_FILE], ignore_git_paths=False)
    )


def read_pem(path, what):
    """The bytes of a PEM file the user named (bounded)."""
    path = os.path.abspath(os.fspath(path))
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_PEM_BYTES + 1)
    except OSError as e:
        raise SignatureError(
            f"Cannot read the {what} '{path}': {e.strerror or e}. Pass the "
            f"path of a PEM file."
        ) from None
    if len(data) > _MAX_PEM_BYTES:
        raise SignatureError(
            f"The {what} '{path}' is too large for a PEM file."
        )
    return path, data


def _check_curve(key, what, path):
    from cryptography.hazmat.primitives.asymmetric import ec

    curves = (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)
    if not isinstance(key, curves):
        raise SignatureError(
            f"The {what} '{path}' is a {type(key).__name__.lstrip('_')}; "
            "model-signing signs with elliptic-curve keys only. Create one "
            "with `openssl ecparam -name prime256v1 -genkey -noout -out "
            "signing.pem` (public part: `openssl ec -in signing.pem -pubout`)."
        )
    if key.curve.name not in SUPPORTED_CURVES:
        raise SignatureError(
            f"The {what} '{path}' uses curve {key.curve.name}; use one of "
            f"{', '.join(SUPPORTED_CURVES)} (P-256, P-384, P-521)."
        )


def fingerprint(public_key):
    """`sha256:<hex>` of a public key's DER SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(
        serialization.Encoding.DER,
        serialization.PublicFormat.SubjectPublicKeyInfo,
    )
    return "sha256:" + hashlib.sha256(der).hexdigest()


def load_public_key(path, what="public key"):
    """Loads and checks a PEM public key.

    Returns:
        `(absolute_path, fingerprint)`.

    Raises:
        SignatureError: the file is missing, not a PEM public key, or not
            an elliptic-curve key on a supported curve.
    """
    from cryptography.hazmat.primitives import serialization

    path, data = read_pem(path, what)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise SignatureError(
            f"The {what} '{path}' is not a PEM public key ({e}). Pass the "
            "public half of the signing key (`-----BEGIN PUBLIC KEY-----`)."
        ) from None
    _check_curve(key, what, path)
    return path, fingerprint(key)


def load_private_key(path, password=None, what="signing key"):
    """Loads and checks a PEM private key; returns `(path, key)`."""
    from cryptography.hazmat.primitives import serialization

    path, data = read_pem(path, what)
    secret = password.encode() if isinstance(password, str) else password
    try:
        key = serialization.load_pem_private_key(data, secret)
    except TypeError as e:  # encrypted without a password, or vice versa
        raise SignatureError(
            f"The {what} '{path}' cannot be opened: {e}. Pass the key's "
            "password (`password=`), or a key without one."
        ) from None
    except ValueError as e:
        raise SignatureError(
            f"The {what} '{path}' is not a PEM private key, or the password "
            f"is wrong ({e})."
        ) from None
    _check_curve(key, what, path)
    return path, key


def load_certificates(paths, what):
    """Loads PEM certificates (every one in each file); returns the paths."""
    from cryptography import x509

    found = []
    for given in paths:
        path, data = read_pem(given, what)
        try:
            if not x509.load_pem_x509_certificates(data):
                raise ValueError("no certificate found")
        except ValueError as e:
            raise SignatureError(
                f"The {what} '{path}' is not a PEM certificate file ({e})."
            ) from None
        found.append(path)
    return found
