"""Signing an artifact: `Signer` and `sign_artifact()`."""

import os
import stat
import tempfile
import uuid

from keras_vllm import format as fmt
from keras_vllm.errors import SignatureError
from keras_vllm.signing import keys


class Signer:
    """A private key (and, optionally, its certificate) that signs artifacts.

    The key is loaded and checked when the `Signer` is made, so a missing or
    unusable key is refused before an export does any work. Pass a `Signer`
    as `signing_key=` to `export_vllm()` or to `sign_artifact()` for a key
    with a password or for certificate-based signing; a plain path is
    enough for a key without a password.

    Args:
        private_key: path of a PEM elliptic-curve private key (P-256, P-384
            or P-521).
        password: the key's password, if it is encrypted.
        certificate: path of a PEM signing certificate for the key
            (certificate-based signing); None signs with the bare key.
        certificate_chain: with `certificate`, paths of the PEM
            certificates that issued it (intermediates, and the root or the
            issuing CA), carried in the signature; at least one.

    Example:

    ```python
    signer = keras_vllm.signing.Signer(
        "ci/signing.pem", certificate="ci/signing.crt",
        certificate_chain=["ci/intermediate.crt"],
    )
    causal_lm.export_vllm("exports/tuned", signing_key=signer)
    ```
    """

    def __init__(self, private_key, *, password=None, certificate=None,
                 certificate_chain=()):
        self.private_key, key = keys.load_private_key(private_key, password)
        self._password = password
        self.fingerprint = keys.fingerprint(key.public_key())
        self.certificate = None
        self.certificate_chain = []
        if certificate is not None:
            from cryptography import x509

            (self.certificate,) = keys.load_certificates(
                [certificate], "signing certificate"
            )
            with open(self.certificate, "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read())
            if cert.public_key() != key.public_key():
                raise SignatureError(
                    f"The signing certificate '{self.certificate}' is not for "
                    f"the key '{self.private_key}'. Pass the certificate "
                    "issued for this key."
                )
            if isinstance(certificate_chain, (str, os.PathLike)):
                certificate_chain = [certificate_chain]
            if not certificate_chain:
                # model-signing 1.1 cannot sign with an empty chain.
                raise SignatureError(
                    f"Signing with the certificate '{self.certificate}' needs "
                    "its issuing chain: pass `certificate_chain=` (CLI: "
                    "`--chain`) with the certificates that issued it, up to "
                    "the root the serving host trusts."
                )
            self.certificate_chain = keys.load_certificates(
                certificate_chain, "certificate chain"
            )
        elif certificate_chain:
            raise SignatureError(
                "`certificate_chain` needs `certificate` (the signing "
                "certificate it completes)."
            )

    def _config(self):
        from model_signing import signing

        config = signing.Config().set_hashing_config(keys.hashing_config())
        if self.certificate is None:
            return config.use_elliptic_key_signer(
                private_key=self.private_key, password=self._password
            )
        return config.use_certificate_signer(
            private_key=self.private_key,
            signing_certificate=self.certificate,
            certificate_chain=self.certificate_chain,
        )

    def sign(self, directory):
        """Writes `directory/model.sig` over every other file, atomically.

        The signature goes to a temporary name (beside the directory when
        it can, so that an interrupted run leaves nothing inside it) and is
        renamed into place: a reader sees the old signature or the new one.
        Checksums are not checked here; `sign_artifact` does that first.

        Returns:
            The path of the signature file.
        """
        directory = os.path.abspath(os.fspath(directory))
        final = os.path.join(directory, fmt.SIGNATURE_FILE)
        temp = _temporary_name(directory)
        try:
            try:
                self._config().sign(directory, temp)
            except SignatureError:
                raise
            except OSError as e:
                raise SignatureError(
                    f"Cannot sign '{directory}': {e.strerror or e}"
                    + (f" ({e.filename})" if e.filename else "")
                    + ". Check that the artifact is readable and writable."
                ) from None
            except Exception as e:  # model-signing raises ValueError & co.
                raise SignatureError(
                    f"Cannot sign '{directory}': {type(e).__name__}: "
                    f"{str(e)[:300]}."
                ) from None
            # Readable by whoever can read the artifact (mkstemp makes 0600).
            os.chmod(temp, _mode_of(os.path.join(directory, fmt.MANIFEST_FILE)))
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, final)
        finally:
            if os.path.lexists(temp):
                os.unlink(temp)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return final


def _mode_of(path):
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o644


def _temporary_name(directory):
    """A fresh name for the signature before it is renamed into place.

    Beside the directory (same file system) when that is writable; else
    inside it, under a name that is only created after hashing.
    """
    parent = os.path.dirname(directory)
    prefix = f".{os.path.basename(directory)}.{fmt.SIGNATURE_FILE}-"
    try:
        if os.stat(parent).st_dev == os.stat(directory).st_dev:
            fd, temp = tempfile.mkstemp(prefix=prefix, dir=parent)
            os.close(fd)
            return temp
    except OSError:
        pass
    return os.path.join(directory, f"{prefix}{uuid.uuid4().hex}")


def as_signer(signing_key):
    """A `Signer` from a `Signer` or a private key path."""
    if isinstance(signing_key, Signer):
        return signing_key
    return Signer(signing_key)


def sign_artifact(directory, signing_key):
    """Signs an existing artifact: writes `model.sig` into its directory.

    The artifact's checksums are verified first (a signature vouches for
    the files as they are), then every file but the signature, the
    manifest included, is signed with OpenSSF model-signing. An existing
    signature is replaced atomically.

    Args:
        directory: the artifact directory.
        signing_key: path of a PEM elliptic-curve private key, or a
            `Signer` (for a password or a certificate).

    Returns:
        The path of the signature file.

    Raises:
        SignatureError: the key cannot be used or the signature written.
        IntegrityError: the artifact does not match its checksums.

    Example:

    ```python
    keras_vllm.sign_artifact("exports/tuned", "ci/signing.pem")
    keras_vllm.verify_signature("exports/tuned", "ci/signing.pub.pem")
    ```
    """
    signer = as_signer(signing_key)
    directory = os.path.abspath(os.fspath(directory))
    fmt.open_artifact(directory)
    return signer.sign(directory)
