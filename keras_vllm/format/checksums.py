"""Integrity: an artifact's files are exactly those its manifest lists."""

import contextlib
import os

from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.format.files import list_files
from keras_vllm.format.files import safe_join
from keras_vllm.format.files import sha256_file
from keras_vllm.format.files import sha256_files
from keras_vllm.format.names import MANIFEST_FILE
from keras_vllm.format.names import SIGNATURE_FILE


def manifest_hash(directory):
    """The SHA-256 of an artifact's `manifest.json`: the artifact's
    identity (the manifest records every other file's digest).

    Raises:
        ArtifactError: the directory has no readable manifest.
    """
    path = safe_join(directory, MANIFEST_FILE)
    try:
        return sha256_file(path)
    except OSError as e:
        raise ArtifactError(
            f"'{directory}' has no readable {MANIFEST_FILE} "
            f"({e.strerror or e}): it is not a keras-vllm artifact, or its "
            "export did not finish. Pass the directory written by "
            "`export_vllm()`."
        ) from None


def files_to_hash(manifest, only=None):
    """The listed files `verify_files` hashes (all, or those under `only`)."""
    return [
        rel
        for rel in sorted(manifest["files"])
        if only is None or rel.startswith(tuple(only))
    ]


def verify_files(directory, manifest, only=None, report=None):
    """Checks that the artifact's files are exactly those the manifest lists,
    with matching sizes and SHA-256 digests.

    Args:
        directory: the artifact directory.
        manifest: its validated manifest.
        only: path prefixes; when given, only files under them are hashed
            (every file is still listed, size-checked and link-checked).
        report: optional progress hook, `report(total_bytes)` returning a
            context manager that yields an `on_bytes(n)` callable.

    Raises:
        IntegrityError: naming the first file that is missing, extra,
            resized or altered.
    """
    listed = manifest["files"]
    # Links and special files first: refused without following or opening
    # them (a FIFO would block a reader). The signature is the one unlisted
    # file: it signs the manifest, so the manifest cannot record it.
    present = set(list_files(directory)) - {MANIFEST_FILE, SIGNATURE_FILE}
    for rel in listed:
        safe_join(directory, rel)
    missing = sorted(set(listed) - present)
    if missing:
        raise IntegrityError(
            f"Artifact file '{missing[0]}' is missing"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + ". The artifact is incomplete; copy it again or re-export."
        )
    extra = sorted(present - set(listed))
    if extra:
        raise IntegrityError(
            f"Artifact file '{extra[0]}' is not listed in the manifest. "
            "Remove it, or re-export the model."
        )
    for rel in sorted(listed):
        size = os.path.getsize(os.path.join(directory, rel))
        if size != listed[rel]["bytes"]:
            raise IntegrityError(
                f"Artifact file '{rel}' has {size} bytes, the manifest "
                f"records {listed[rel]['bytes']}. The file is truncated or "
                "altered; copy the artifact again or re-export."
            )
    hashed = files_to_hash(manifest, only)
    total = sum(listed[rel]["bytes"] for rel in hashed)
    context = report(total) if report is not None else contextlib.nullcontext()
    with context as on_bytes:
        digests = sha256_files(
            [os.path.join(directory, rel) for rel in hashed], on_bytes
        )
        for rel, digest in zip(hashed, digests):
            if digest != listed[rel]["sha256"]:
                raise IntegrityError(
                    f"Artifact file '{rel}' does not match its SHA-256 "
                    "checksum. The file is corrupt or altered; copy the "
                    "artifact again or re-export."
                )
