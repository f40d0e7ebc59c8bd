"""Opening an artifact for a reader, with a progress line for the hashing."""

import contextlib

from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.signing.policy import public_key_for
from keras_vllm.signing.policy import signed_digests


@contextlib.contextmanager
def _hashing(total, verbose):
    with progress.phase(
        "verifying checksums", total=total, unit="bytes", verbose=verbose
    ) as phase:
        yield phase.advance


def open_verified(path, verify=True, only=None, verbose=False, validate=True,
                  public_key=None):
    """Opens an artifact, verifies its checksums and cross-checks its files.

    With a signature policy (`public_key`, else `KERAS_VLLM_PUBLIC_KEY`) the
    signature is verified first, before the manifest is parsed.

    Args:
        path: the artifact directory.
        verify: whether to check sizes and checksums.
        only: path prefixes of the files to hash (None: all).
        verbose: progress of the hashing (see `keras_vllm.progress`); off by
            default, for the many processes that re-open an artifact.
        validate: whether to run the cross-file consistency checks.
        public_key: path of the PEM public key the artifact must be signed
            by; None uses `KERAS_VLLM_PUBLIC_KEY` (unset: no signature
            needed).

    Returns:
        A new `keras_vllm.format.Artifact` (verified afresh).
    """
    signed = {}
    if public_key_for(public_key)[0] is not None:
        with progress.phase("verifying the signature", verbose=verbose):
            signed = signed_digests(path, public_key)
    # The manifest parsed must be the one the signature vouched for.
    opened = fmt.open_artifact(
        path, verify=False, manifest_sha256=signed.get(fmt.MANIFEST_FILE)
    )
    if verify:
        opened.verify(only, report=lambda total: _hashing(total, verbose))
    if validate:
        opened.validate()
    return opened
