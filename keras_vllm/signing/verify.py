"""Verifying an artifact's signature before anything else of it is read.

Nothing is cached: every verification hashes the files again, so bytes
rewritten after a verification (even with their size, inode and mtime
restored) are never trusted from an earlier result. A verification returns
the signed digest of each file; a reader that then parses the manifest
checks the bytes it parsed against that digest (`signed_digests`), so the
manifest has no window between its verification and its use.
"""

import base64
import hashlib
import json
import os
import re
import tempfile

from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import SignatureError
from keras_vllm.signing import keys


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
    The signature must cover every file but itself: one made with paths
    left out (model-signing's ignore-paths) is refused. Nothing is cached:
    each call hashes the files again.

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
            a file was changed, added or removed after signing, or the
            signature leaves files out.

    Example:

    ```python
    keras_vllm.verify_signature("exports/tuned", "keys/release.pub.pem")
    ```
    """
    return verify_signed(
        directory, public_key, certificate_chain=certificate_chain,
        required_by=required_by,
    )[0]


def verify_signed(directory, public_key=None, *, certificate_chain=None,
                  required_by=None):
    """`verify_signature`, returning `(signature path, {file: sha256})`:
    the digests the signature vouches for, to check what is read next."""
    _, trusted, use = _trust(public_key, certificate_chain)
    path = os.path.abspath(os.fspath(directory))
    asked = f" ({required_by} requires it)" if required_by else ""
    if not os.path.isdir(path):
        raise ArtifactError(
            f"'{path}' is not a directory. Pass the directory written by "
            "`export_vllm()`."
        )
    signature = os.path.join(path, fmt.SIGNATURE_FILE)
    present = set(fmt.list_files(path))
    if fmt.SIGNATURE_FILE not in present:
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
    with open(signature, "rb") as f:
        bundle = f.read(fmt.MAX_SIGNATURE_BYTES + 1)
    from model_signing import verifying

    config = use(verifying.Config()).set_hashing_config(keys.hashing_config())
    # model-signing reads the signature from a path: a private copy of the
    # bytes read above, so the bundle it verifies is the one parsed below.
    with tempfile.TemporaryDirectory(prefix="keras_vllm_sig_") as scratch:
        copy = os.path.join(scratch, fmt.SIGNATURE_FILE)
        with open(copy, "wb") as f:
            f.write(bundle)
        try:
            config.verify(path, copy)
        except Exception as e:  # whatever the bundle or the hashing raised
            raise SignatureError(
                f"The signature of '{path}' does not verify with "
                f"{trusted}{asked}: {_explain(e)} Copy the artifact again "
                "from where it was signed; if the change is intended, sign "
                "it again (`keras-vllm sign`)."
            ) from None
    digests = _signed_resources(path, bundle)
    # model-signing verifies with the ignore-paths recorded in the signature
    # added to the verifier's: a file left out at signing is left out here.
    uncovered = sorted(present - {fmt.SIGNATURE_FILE} - set(digests))
    if uncovered:
        names = ", ".join(f"'{rel}'" for rel in uncovered[:5])
        more = f" (and {len(uncovered) - 5} more)" if len(uncovered) > 5 else ""
        raise SignatureError(
            f"The signature of '{path}' does not cover {names}{more}: it was "
            "made with paths left out (model-signing's ignore-paths), so "
            f"those files could be changed without it noticing{asked}. "
            "keras-vllm requires a signature over every file of the "
            f"artifact but {fmt.SIGNATURE_FILE}; sign it again with "
            f"`keras-vllm sign {path} --key PRIVATE_KEY`."
        )
    return signature, digests


def _signed_resources(path, bundle):
    """`{relative path: sha256}` the verified bundle's statement lists."""
    try:
        envelope = json.loads(bundle)["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"]))
        resources = statement["predicate"]["resources"]
        digests = {}
        for resource in resources:
            if resource.get("algorithm", "sha256") != "sha256":
                raise ValueError(f"algorithm {resource['algorithm']!r}")
            digests[str(resource["name"])] = str(resource["digest"])
        return digests
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SignatureError(
            f"The signature of '{path}' verifies but its statement does not "
            "list the signed files as model-signing 1.x writes them "
            f"({e!r:.200}). Sign the artifact with `keras-vllm sign`."
        ) from None


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
