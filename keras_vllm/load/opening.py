"""Opening an artifact for a reader, with a progress line for the hashing."""

import contextlib

from keras_vllm import format as fmt
from keras_vllm import progress


@contextlib.contextmanager
def _hashing(total, verbose):
    with progress.phase(
        "verifying checksums", total=total, unit="bytes", verbose=verbose
    ) as phase:
        yield phase.advance


def open_verified(path, verify=True, only=None, verbose=False, validate=True):
    """Opens an artifact, verifies its checksums and cross-checks its files.

    Args:
        path: the artifact directory.
        verify: whether to check sizes and checksums.
        only: path prefixes of the files to hash (None: all).
        verbose: progress of the hashing (see `keras_vllm.progress`); off by
            default, for the many processes that re-open an artifact.
        validate: whether to run the cross-file consistency checks.

    Returns:
        A `keras_vllm.format.Artifact` (one per directory and process).
    """
    opened = fmt.open_artifact(path, verify=False)
    if verify:
        opened.verify(only, report=lambda total: _hashing(total, verbose))
    if validate:
        opened.validate()
    return opened
