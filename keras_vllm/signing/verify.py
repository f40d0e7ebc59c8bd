"""Verifying an artifact's signature before anything else of it is read."""

import hashlib
import os
import re
import threading

from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import SignatureError
from keras_vllm.signing import keys

# (directory, trust) -> the listing and stats the signature verified; a
# process that reopens an unchanged artifact (and a forked child) does not
# hash it again.
_VERIFIED = {}
_LOCK = threading.Lock()
_MAX_VERIFIED = 32


def _stamp(directory):
    """Every file's name, size, mtime and inode (links refused)."""
    stamp = []
    for rel in fmt.list_files(directory):
        st = os.lstat(os.path.join(directory, rel))
        stamp.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(stamp)


def _trust(public_key, certificate_chain):
    """`(cache key, description, model-signing verifier setup)`."""
    if (public_key is None) == (certificate_chain is None):
        raise SignatureError(
            "Verify a signature with either a public key or a certificate "
            "chain (exactly one of `public_key=` / `certificate_chain=`)."
        )
    if public_key is not None:
        path, print_ = keys.load_public_key(public_key)
        return (
            ("key", print_),
            f"the public key '{path}'",
            lambda config: config.use_elliptic_key_verifier(public_key=path),
        )
    if isinstance(certificate_chain, (str, os.PathLike)):
        certificate_chain = [certificate_chain]
    paths = keys.load_certificates(certificate_chain, "certificate chain")
    if not paths:
        raise SignatureError(
            "`certificate_chain` is empty; pass the PEM root (and "
            "intermediate) certificates the signing certificate chains to."
        )
    digest = hashlib.sha256()
    for given in paths:
        digest.update(keys.read_pem(given, "certificate chain")[1])
    return (
        ("chain", digest.hexdigest()),
        f"the certificate chain {', '.join(repr(p) for p in paths)}",
        lambda config: config.use_certificate_verifier(certificate_chain=paths),
    )


def verify_signature(directory, public_key=None, *, certificate_chain=None,
                     required_by=None):
    """Checks an artifact's signature (`model.sig`) over all its files.

    Only the directory listing and the bytes of its files are read (hashed):
    no file is parsed, the manifest included, before the signature verifies.

    Args:
        directory: the artifact directory.
        public_key: path of the PEM public key the artifact must be signed
            by (key-based signing).
        certificate_chain: instead of `public_key`, paths of the PEM root
            (and intermediate) certificates the signing certificate must
            chain to (certificate-based signing).
        required_by: who asked, for messages (e.g. `"KERAS_VLLM_PUBLIC_KEY"`).

    Returns:
        The path of the verified signature file.

    Raises:
        SignatureError: the artifact is unsigned, was signed by another key,
            or a file was changed, added or removed after signing.

    Example:

    ```python
    keras_vllm.verify_signature("exports/tuned", "keys/release.pub.pem")
    ```
    """
    cache_key, trusted, use = _trust(public_key, certificate_chain)
    path = os.path.abspath(os.fspath(directory))
    asked = f" ({required_by} requires it)" if required_by else ""
    if not os.path.isdir(path):
        raise ArtifactError(
            f"'{path}' is not a directory. Pass the directory written by "
            "`export_vllm()`."
        )
    stamp = _stamp(path)
    signature = os.path.join(path, fmt.SIGNATURE_FILE)
    if fmt.SIGNATURE_FILE not in {entry[0] for entry in stamp}:
        raise SignatureError(
            f"'{path}' is not signed: it has no {fmt.SIGNATURE_FILE}, and a "
            f"signature by {trusted} is required{asked}. Sign it where it was "
            f"exported (`keras-vllm sign {path} --key PRIVATE_KEY`, or "
            "`export_vllm(..., signing_key=...)`) and copy it again."
        )
    if os.path.getsize(signature) > fmt.MAX_SIGNATURE_BYTES:
        raise SignatureError(
            f"'{signature}' is larger than the {fmt.MAX_SIGNATURE_BYTES} "
            "bytes a signature may have; it is not one keras-vllm wrote. "
            "Re-sign the artifact."
        )
    with _LOCK:
        if _VERIFIED.get((path, cache_key)) == stamp:
            return signature
    from model_signing import verifying

    config = use(verifying.Config()).set_hashing_config(keys.hashing_config())
    try:
        config.verify(path, signature)
    except Exception as e:  # whatever the bundle or the hashing raised
        raise SignatureError(
            f"The signature of '{path}' does not verify with {trusted}{asked}: "
            f"{_explain(e)} Copy the artifact again from where it was signed; "
            "if the change is intended, sign it again (`keras-vllm sign`)."
        ) from None
    if _stamp(path) == stamp:  # unchanged while it was hashed
        with _LOCK:
            if len(_VERIFIED) >= _MAX_VERIFIED:
                _VERIFIED.pop(next(iter(_VERIFIED)))
            _VERIFIED[(path, cache_key)] = stamp
    return signature


def _explain(error):
    """One sentence for what model-signing found (it names files)."""
    from cryptography import exceptions

    text = str(error)
    if isinstance(error, exceptions.InvalidSignature) or "Key mismatch" in text:
        return (
            f"{fmt.SIGNATURE_FILE} was made with another key, or altered."
        )
    if type(error).__name__.startswith("X509"):  # pyOpenSSL's chain check
        return (
            "its signing certificate does not chain to the trusted "
            f"certificates ({text[:200]})."
        )
    if text.startswith("Signature mismatch"):
        # model-signing formats a list of sentences; their quotes may come
        # back escaped (a repr), depending on the digests' bytes.
        changed = re.findall(r"Hash mismatch for \\?'(.*?)\\?'", text)
        added = re.search(r"Extra files found in model .*?: ([^\"\]]*)", text)
        removed = re.search(r"Missing files in model .*?: ([^\"\]]*)", text)
        parts = []
        if changed:
            names = ", ".join(f"'{rel}'" for rel in changed[:3])
            more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
            parts.append(
                f"{'files' if len(changed) > 1 else 'file'} {names}{more} "
                f"{'were' if len(changed) > 1 else 'was'} changed after signing"
            )
        if added:
            parts.append(f"'{added.group(1).strip()}' was added after signing")
        if removed:
            parts.append(
                f"'{removed.group(1).strip()}' is missing (it was signed)"
            )
        if parts:
            return "; ".join(parts) + "."
    return (
        f"{fmt.SIGNATURE_FILE} is not a valid signature "
        f"({type(error).__name__}: {text[:300]})."
    )
