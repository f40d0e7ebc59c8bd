"""An opened artifact: each file parsed once per process.

An engine start reads the same artifact in several places of one process
(the engine's checks, serving defaults, the tokenizer, the loader).
`open_artifact` returns one `Artifact` per directory and process, which
remembers what it has already verified, validated and parsed. It is
reused only while every listed file still has the size, modification time
and inode it had when it was verified: a file changed afterwards is
verified again, never trusted from memory.

The same rule carries across one process boundary: after hashing every
file, the engine parent hands its stat digest to the engine process it
starts (`handoff()`, in `KERAS_VLLM_VERIFIED_ARTIFACT`), which then skips
hashing the weights a second time while the digest still matches.
"""

import hashlib
import json
import os
import threading

from keras_vllm import envs

from keras_vllm.format import checksums
from keras_vllm.format import consistency
from keras_vllm.format.checks import fail
from keras_vllm.format.files import read_json
from keras_vllm.format.files import safe_join
from keras_vllm.format.manifest import read_manifest
from keras_vllm.format.names import MANIFEST_FILE

_OPENED = {}
_LOCK = threading.Lock()
_MAX_OPENED = 32


def _stat_key(path, manifest):
    """Size, mtime and inode of the manifest and of every listed file."""
    key = []
    for rel in (MANIFEST_FILE, *sorted(manifest["files"])):
        try:
            st = os.lstat(os.path.join(path, rel))
        except OSError:
            return None
        key.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(key)


def _stat_digest(path, stat_key):
    text = json.dumps([path, stat_key], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _handed_off(path, stat_key):
    """Whether the parent process verified this exact state of the files."""
    value = envs.VERIFIED_ARTIFACT.raw()
    return (
        value is not None
        and stat_key is not None
        and value == _stat_digest(path, stat_key)
    )


class Artifact:
    """A keras-vllm artifact directory, opened and (by default) verified.

    Use `keras_vllm.format.open_artifact(path)`.

    Attributes:
        path: the absolute artifact directory.
        manifest: the validated manifest dict.
    """

    def __init__(self, path, manifest):
        self.path = path
        self.manifest = manifest
        self._verified = set()  # prefixes hashed; None means every file
        self._validated = False
        self._json = {}
        self._stat_key = _stat_key(path, manifest)
        if _handed_off(path, self._stat_key):
            self._verified.add(None)

    def handoff(self):
        """Lets processes started from now on skip re-hashing this artifact.

        Call only after `verify()` of every file. Sets
        `KERAS_VLLM_VERIFIED_ARTIFACT` to a digest of the files' sizes,
        mtimes and inodes; a process that opens the artifact with the same
        stats trusts the hashes, any change re-hashes.
        """
        if None in self._verified and self._stat_key is not None:
            envs.VERIFIED_ARTIFACT.set(_stat_digest(self.path, self._stat_key))
        return self

    def _verified_for(self, only):
        if None in self._verified:
            return True
        return only is not None and all(
            any(prefix.startswith(done) for done in self._verified)
            for prefix in only
        )

    def verify(self, only=None, report=None):
        """Checks file sizes and checksums (all, or those under `only`).

        Args:
            only: path prefixes of the files to hash; None hashes all.
            report: a progress hook (see `checksums.verify_files`).
        """
        only = None if only is None else tuple(only)
        if self._verified_for(only):
            return self
        checksums.verify_files(self.path, self.manifest, only, report)
        self._verified.update([None] if only is None else only)
        return self

    def read_json(self, rel):
        """A listed JSON file of the artifact, parsed once (bounded)."""
        if rel not in self._json:
            if rel not in self.manifest["files"]:
                fail(
                    f"The artifact has no '{rel}'; re-export the model."
                )
            self._json[rel] = read_json(safe_join(self.path, rel), what=rel)
        return self._json[rel]

    def validate(self):
        """Cross-checks the files against each other (once)."""
        if not self._validated:
            consistency.validate_artifact(
                self.path, self.manifest, read=self.read_json
            )
            self._validated = True
        return self

    def file(self, rel):
        """The absolute path of a file or folder of the artifact."""
        return safe_join(self.path, rel)


def open_artifact(directory, verify=True, only=None, report=None):
    """Opens an artifact: reads its manifest and verifies its checksums.

    Args:
        directory: the artifact directory.
        verify: whether to check file sizes and checksums now.
        only: path prefixes of the files to hash (see
            `checksums.verify_files`), for readers of part of an artifact;
            None hashes every file.
        report: a progress hook for the hashing.

    Returns:
        An `Artifact`; the same one for the same unchanged directory within
        this process.

    Example:

    ```python
    opened = keras_vllm.format.open_artifact("exports/tuned")
    opened.validate()
    opened.manifest["weights"]["mode"]
    ```
    """
    path = os.path.abspath(os.fspath(directory))
    manifest = read_manifest(path)
    with _LOCK:
        opened = _OPENED.get(path)
    if (
        opened is None
        or opened.manifest != manifest
        or opened._stat_key is None
        or opened._stat_key != _stat_key(path, manifest)
    ):
        opened = Artifact(path, manifest)
        with _LOCK:
            if len(_OPENED) >= _MAX_OPENED:
                _OPENED.pop(next(iter(_OPENED)))
            _OPENED[path] = opened
    if verify:
        opened.verify(only, report)
    return opened
