"""The manifest's file table: one checksum, size and bound per file.

`validate()` checks each entry (a hex SHA-256, a size in range) and every
recorded size against the bound the format sets for that kind of file, so
an oversized asset or JSON file is refused from the manifest alone, before
verification reads (or hashes) anything.
"""

from keras_vllm.format.checks import fail
from keras_vllm.format.checks import field
from keras_vllm.format.checks import invalid_unless
from keras_vllm.format.checks import is_sha256
from keras_vllm.format.names import CHAT_TEMPLATE_FILE as _CHAT
from keras_vllm.format.names import GOLDEN_FILE as _GOLDEN
from keras_vllm.format.names import MANIFEST_FILE
from keras_vllm.format.names import MAX_CHAT_TEMPLATE_BYTES
from keras_vllm.format.names import MAX_FILE_BYTES
from keras_vllm.format.names import MAX_FILES
from keras_vllm.format.names import MAX_GOLDEN_BYTES
from keras_vllm.format.names import MAX_MANIFEST_BYTES
from keras_vllm.format.names import MAX_SMALL_JSON_BYTES
from keras_vllm.format.names import MAX_TOKENIZER_ASSET_BYTES
from keras_vllm.format.names import SIGNATURE_FILE
from keras_vllm.format.names import TOKENIZER_ASSETS_DIR as _ASSETS
from keras_vllm.format.names import WEIGHTS_DIR


def _size_limit(rel):
    """The most bytes the format allows for one of its files (None: the
    weights, bounded by the parameter limit instead)."""
    if rel.startswith(_ASSETS + "/"):
        return MAX_TOKENIZER_ASSET_BYTES
    if rel == _GOLDEN:
        return MAX_GOLDEN_BYTES
    if rel == _CHAT:
        return MAX_CHAT_TEMPLATE_BYTES
    if rel in (WEIGHTS_DIR + "/_METADATA", WEIGHTS_DIR + "/_sharding"):
        return MAX_MANIFEST_BYTES
    if rel.startswith(WEIGHTS_DIR + "/"):
        return None
    return MAX_SMALL_JSON_BYTES


def _check_file_sizes(manifest):
    """Every asset and JSON file within its bound, before any is read (the
    recorded sizes: verification compares them with the disk before it
    hashes anything)."""
    for rel, entry in sorted(manifest["files"].items()):
        limit = _size_limit(rel)
        if limit is not None and entry["bytes"] > limit:
            fail(
                f"Artifact file '{rel[:200]}' is {entry['bytes']} bytes, more "
                f"than the {limit} the format allows for it. The artifact "
                "was altered or is not a keras-vllm export; re-export it."
            )


def validate(manifest):
    """Checks `manifest["files"]`: entries, then each size's bound."""
    files = field(manifest, "files", dict, "manifest")
    invalid_unless(len(files) <= MAX_FILES, "too many files listed.")
    for rel, entry in files.items():
        invalid_unless(0 < len(rel) < 1000, "a file name has a bad length.")
        where = f"files['{rel}']"
        invalid_unless(
            rel not in (MANIFEST_FILE, SIGNATURE_FILE),
            f"'files' lists '{rel}', which is never checksummed (the "
            "manifest holds the checksums, the signature signs them).",
        )
        digest = field(entry, "sha256", str, where)
        invalid_unless(
            is_sha256(digest), f"{where}.sha256 is not a hex SHA-256."
        )
        size = field(entry, "bytes", int, where)
        invalid_unless(size >= 0, f"{where}.bytes is negative.")
        invalid_unless(
            size <= MAX_FILE_BYTES, f"{where}.bytes is out of range."
        )
    _check_file_sizes(manifest)
