"""An opened artifact: one reading of an artifact directory.

An engine start reads the same artifact in several places; each
`open_artifact` call returns a new `Artifact`, and nothing verified is
carried from one to the next. A verification result is only ever reused
where the bytes are proven unchanged:

* JSON files read through `Artifact.read_json` are hashed as they are read
  (once, into memory) and must match the digest the manifest records, so
  what is parsed is what was verified, whenever it was verified;
* under a signature policy the manifest's own bytes must match the digest
  the signature vouches for (`open_artifact(..., manifest_sha256=...)`);
* the other files (the weights) are hashed by `verify()` once per
  `Artifact`. The window: bytes rewritten between that hash and the
  reader's own read of them (the weights restore, moments later in the same
  load) are not seen. The next open, in this process or in an engine
  process it starts, hashes them again; no size, mtime or inode is trusted.
"""

import os

from keras_vllm.format import checksums
from keras_vllm.format import consistency
from keras_vllm.format.checks import fail
from keras_vllm.format.files import read_json
from keras_vllm.format.files import safe_join
from keras_vllm.format.manifest import read_manifest


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
        """A listed JSON file of the artifact, parsed once (bounded); its
        bytes as read must match the manifest's digest."""
        if rel not in self._json:
            if rel not in self.manifest["files"]:
                fail(
                    f"The artifact has no '{rel}'; re-export the model."
                )
            self._json[rel] = read_json(
                safe_join(self.path, rel), what=rel,
                sha256=self.manifest["files"][rel]["sha256"],
            )
        return self._json[rel]

    def validate(self):
        """Cross-checks the files against each other (once)."""
        if not self._validated:
            consistency.validate_artifact(self)
            self._validated = True
        return self

    def file(self, rel):
        """The absolute path of a file or folder of the artifact."""
        return safe_join(self.path, rel)


def open_artifact(directory, verify=True, only=None, report=None,
                  manifest_sha256=None):
    """Opens an artifact: reads its manifest and verifies its checksums.

    Args:
        directory: the artifact directory.
        verify: whether to check file sizes and checksums now.
        only: path prefixes of the files to hash (see
            `checksums.verify_files`), for readers of part of an artifact;
            None hashes every file.
        report: a progress hook for the hashing.
        manifest_sha256: the digest the manifest's bytes must have (the
            one a verified signature vouches for).

    Returns:
        A new `Artifact` (nothing verified is reused from an earlier open).

    Example:

    ```python
    opened = keras_vllm.format.open_artifact("exports/tuned")
    opened.validate()
    opened.manifest["weights"]["mode"]
    ```
    """
    path = os.path.abspath(os.fspath(directory))
    opened = Artifact(path, read_manifest(path, sha256=manifest_sha256))
    if verify:
        opened.verify(only, report)
    return opened
