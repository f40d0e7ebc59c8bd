"""The keras-vllm artifact format: file layout, manifest schema, checksums.

This is the only module that knows file names. `export/` writes artifacts
through it and `load/` reads them through it; docs/FORMAT.md describes the
same thing in prose. Everything here is plain Python and JSON: reading or
verifying an artifact never imports JAX, Keras or vLLM, never executes code
from the artifact, and never allocates more than the size of a file it has
already bounded.
"""

import hashlib
import json
import math
import os
import re
import stat

from keras_vllm import progress
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import VersionSkewError

FORMAT_NAME = "keras_vllm"
# The major version changes when a reader of an older version could
# misread an artifact; the minor version when fields are only added.
FORMAT_VERSION = (1, 0)

# vLLM-facing names. Chosen so they cannot collide with keras-hub 0.32's own
# plugin, which registers `keras_hub` / `KerasHubForCausalLM`.
MODEL_TYPE = "keras_vllm"
ARCHITECTURE = "KerasVllmForCausalLM"
TOKENIZER_MODE = "keras_vllm"

MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
GOLDEN_FILE = "golden.json"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_CONFIG_FILE = "tokenizer/config.json"
TOKENIZER_ASSETS_DIR = "tokenizer/assets"
WEIGHTS_DIR = "weights"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

WEIGHT_MODES = ("preset", "delta", "full")

# Bounds checked before anything is allocated from a manifest's numbers.
MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_FILE_BYTES = 64 << 20
MAX_DIM = 1 << 24
MAX_ELEMENTS = 1 << 36
MAX_FILES = 100_000
MAX_FILE_BYTES = 1 << 42
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")

# Every top-level manifest field of format 1.0 (`validate_manifest` refuses
# others unless the artifact declares a newer minor version).
MANIFEST_FIELDS = (
    "format",
    "format_version",
    "written_by",
    "created",
    "preset",
    "dtype",
    "stop_token_ids",
    "max_sequence_length",
    "sampler_in_vllm",
    "servable",
    "unservable_reason",
    "parameter_count",
    "weights",
    "backbone",
    "causal_lm",
    "tokenizer",
    "preprocessor",
    "sampler",
    "files",
)
_PRESET_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")

_CHUNK = 1 << 20


def sha256_file(path):
    """Returns the hex SHA-256 of a file, read in bounded chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            progress.advance(len(chunk))
    return digest.hexdigest()


def list_files(directory):
    """Lists every regular file below `directory` as sorted relative paths.

    Raises:
        ArtifactError: if the tree holds a symlink or a special file (an
            artifact is plain files and folders only).
    """
    found = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            full = os.path.join(root, name)
            mode = os.lstat(full).st_mode
            rel = os.path.relpath(full, directory).replace(os.sep, "/")
            if stat.S_ISLNK(mode):
                raise ArtifactError(
                    f"Artifact entry '{rel}' is a symbolic link. Artifacts "
                    "hold plain files only; re-export the model instead of "
                    "linking files into the artifact."
                )
            if stat.S_ISREG(mode):
                found.append(rel)
            elif not stat.S_ISDIR(mode):
                raise ArtifactError(
                    f"Artifact entry '{rel}' is not a regular file."
                )
            if len(found) > MAX_FILES:
                raise ArtifactError(
                    f"Artifact holds more than {MAX_FILES} files."
                )
    return sorted(found)


def file_table(directory, exclude=(MANIFEST_FILE,)):
    """Returns `{relative_path: {"sha256", "bytes"}}` for an artifact tree."""
    table = {}
    for rel in list_files(directory):
        if rel in exclude:
            continue
        full = os.path.join(directory, rel)
        table[rel] = {
            "sha256": sha256_file(full),
            "bytes": os.path.getsize(full),
        }
    return table


def safe_join(directory, relative):
    """Joins a manifest-supplied path to the artifact root, confined to it.

    Raises:
        ArtifactError: for absolute paths, `..` components, or paths that
            resolve (through links) outside the artifact.
    """
    if not isinstance(relative, str) or not relative:
        raise ArtifactError(f"Invalid file reference {relative!r}.")
    if relative.startswith(("/", "\\")) or os.path.isabs(relative):
        raise ArtifactError(
            f"File reference '{relative}' is absolute; artifact files must "
            "be relative to the artifact directory."
        )
    parts = relative.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(
            f"File reference '{relative}' leaves the artifact directory."
        )
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, full]) != root:
        raise ArtifactError(
            f"File reference '{relative}' resolves outside the artifact."
        )
    return full


def read_json(path, limit=MAX_JSON_FILE_BYTES, what=None):
    """Reads a bounded JSON file, raising `ArtifactError` on any problem."""
    what = what or os.path.basename(path)
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ArtifactError(f"Cannot read {what}: {e}.") from None
    if size > limit:
        raise ArtifactError(
            f"{what} is {size} bytes, more than the {limit} allowed."
        )
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ArtifactError(f"Cannot read {what}: {e}.") from None
    if len(data) > limit:
        raise ArtifactError(f"{what} is more than the {limit} bytes allowed.")
    try:
        return json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{what} is not UTF-8 text: {e}.") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, huge ints
        raise ArtifactError(
            f"{what} is not valid JSON: {str(e)[:200]}. The file is corrupt "
            "or was not written by keras-vllm; re-export the model."
        ) from None


def _unique_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key[:100]!r}")
        result[key] = value
    return result


def _no_constant(name):
    # NaN and Infinity are not JSON; Python's parser accepts them by default.
    raise ValueError(f"non-standard constant {name}")


def write_json(path, value):
    """Writes JSON deterministically (sorted keys, UTF-8, trailing newline)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


# ---------------------------------------------------------------------------
# Manifest validation. Each check names the field and what was expected, so
# a hand-edited or hostile manifest fails with a message, not deep in JAX.
# ---------------------------------------------------------------------------


def _expect(condition, message):
    if not condition:
        raise ArtifactError(f"Invalid manifest: {message}")


def _field(obj, key, kind, where):
    _expect(isinstance(obj, dict), f"'{where}' must be an object.")
    _expect(key in obj, f"missing field '{where}.{key}'.")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (
        isinstance(value, bool) and bool not in kinds
    )
    _expect(ok, f"'{where}.{key}' must be {_kind_name(kinds)}.")
    return value


def _kind_name(kinds):
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
        list: "a list",
        type(None): "null",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def validate_shape(shape, where):
    """Checks a manifest shape: a short list of positive bounded ints."""
    _expect(isinstance(shape, list), f"'{where}' must be a list.")
    _expect(len(shape) <= 8, f"'{where}' has more than 8 dimensions.")
    for d in shape:
        _expect(
            isinstance(d, int) and not isinstance(d, bool),
            f"'{where}' must hold integers.",
        )
        _expect(0 < d <= MAX_DIM, f"'{where}' has dimension {d} out of range.")
    _expect(
        math.prod(shape) <= MAX_ELEMENTS, f"'{where}' has too many elements."
    )
    return tuple(shape)


def validate_manifest(manifest):
    """Validates a parsed manifest; returns it unchanged when valid.

    Raises:
        VersionSkewError: for another format or a newer major version.
        ArtifactError: for any missing field or wrong type or range.
    """
    _expect(isinstance(manifest, dict), "the manifest must be a JSON object.")
    fmt = manifest.get("format")
    _expect(fmt == FORMAT_NAME, f"'format' must be '{FORMAT_NAME}'.")
    version = _field(manifest, "format_version", list, "manifest")
    _expect(
        len(version) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in version),
        "'format_version' must be [major, minor].",
    )
    if version[0] != FORMAT_VERSION[0]:
        raise VersionSkewError(
            f"This artifact uses format version {version[0]}.{version[1]}, "
            f"but this keras-vllm reads major version {FORMAT_VERSION[0]}. "
            + (
                "Upgrade keras-vllm (`pip install -U keras-vllm`)."
                if version[0] > FORMAT_VERSION[0]
                else "Re-export the model with this keras-vllm."
            )
        )
    if version[1] <= FORMAT_VERSION[1]:
        # Fields are only added in newer minor versions, so an artifact of
        # this or an older version holds no field this reader does not know.
        unknown = sorted(set(manifest) - set(MANIFEST_FIELDS))
        if unknown:
            _expect(
                False,
                f"unknown field '{unknown[0][:100]}' (format "
                f"{version[0]}.{version[1]} has no such field).",
            )
    written_by = _field(manifest, "written_by", dict, "manifest")
    _expect(len(written_by) <= 32, "'written_by' has too many entries.")
    for key, value in written_by.items():
        _expect(
            isinstance(value, str) and len(key) < 100 and len(value) < 100,
            "'written_by' must map package names to version strings.",
        )
    for key in ("created", "unservable_reason"):
        if manifest.get(key) is not None:
            value = _field(manifest, key, str, "manifest")
            _expect(len(value) < 10_000, f"'{key}' is too long.")
    for key in ("servable", "sampler_in_vllm"):
        if key in manifest:
            _field(manifest, key, bool, "manifest")
    if "parameter_count" in manifest:
        count = _field(manifest, "parameter_count", int, "manifest")
        _expect(0 <= count <= MAX_ELEMENTS, "'parameter_count' out of range.")
    for section in ("backbone", "causal_lm", "tokenizer", "preprocessor"):
        obj = _field(manifest, section, dict, "manifest")
        name = _field(obj, "registered_name", str, section)
        _expect(len(name) < 200, f"'{section}.registered_name' is too long.")
        _field(obj, "config", dict, section)
    sampler = _field(manifest, "sampler", dict, "manifest")
    name = _field(sampler, "registered_name", str, "sampler")
    _expect(len(name) < 200, "'sampler.registered_name' is too long.")
    _field(sampler, "config", dict, "sampler")
    dtype = _field(manifest, "dtype", str, "manifest")
    _expect(
        dtype in SUPPORTED_DTYPES,
        f"'dtype' is '{dtype}', expected one of {SUPPORTED_DTYPES}.",
    )
    stops = _field(manifest, "stop_token_ids", list, "manifest")
    _expect(len(stops) <= 1000, "'stop_token_ids' is too long.")
    _expect(
        all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_DIM
            for i in stops
        ),
        "'stop_token_ids' must be non-negative integers.",
    )
    max_len = _field(manifest, "max_sequence_length", int, "manifest")
    _expect(0 < max_len <= MAX_DIM, "'max_sequence_length' out of range.")
    preset = manifest.get("preset")
    if preset is not None:
        handle = _field(preset, "handle", str, "preset")
        _expect(0 < len(handle) < 4096, "'preset.handle' has a bad length.")
        _expect("\x00" not in handle, "'preset.handle' holds a NUL byte.")
        files = _field(preset, "files", dict, "preset")
        _expect(len(files) <= 10_000, "'preset.files' lists too many files.")
        for name, digest in files.items():
            # Plain file names inside the preset: never a path that could
            # make the loader hash a file outside it.
            _expect(
                _PRESET_FILE.fullmatch(name) is not None
                and name not in (".", ".."),
                f"'preset.files' names '{name[:100]}', not a preset file "
                "name.",
            )
            _expect(
                _is_sha256(digest),
                "'preset.files' must map file names to SHA-256 strings.",
            )
    weights = _field(manifest, "weights", dict, "manifest")
    mode = _field(weights, "mode", str, "weights")
    _expect(
        mode in WEIGHT_MODES,
        f"'weights.mode' is '{mode}', expected one of {WEIGHT_MODES}.",
    )
    _expect(
        mode == "full" or preset is not None,
        f"'weights.mode' is '{mode}' but the manifest has no preset.",
    )
    _expect(
        weights.get("format", "orbax") == "orbax",
        "'weights.format' must be 'orbax'.",
    )
    _expect(
        weights.get("directory") in (None, WEIGHTS_DIR),
        f"'weights.directory' must be '{WEIGHTS_DIR}' or null.",
    )
    _expect(
        weights.get("lora", "merged") == "merged",
        "'weights.lora' must be 'merged'.",
    )
    for key in ("bytes", "total_variables"):
        if key in weights:
            value = _field(weights, key, int, "weights")
            _expect(0 <= value <= MAX_ELEMENTS * 8, f"'weights.{key}' out of range.")
    variables = _field(weights, "variables", dict, "weights")
    _expect(len(variables) <= MAX_FILES, "too many weight variables listed.")
    for path, spec in variables.items():
        where = f"weights.variables['{path}']"
        _expect(
            isinstance(path, str) and 0 < len(path) < 1000,
            f"{where}: bad variable path.",
        )
        validate_shape(_field(spec, "shape", list, where), f"{where}.shape")
        vdtype = _field(spec, "dtype", str, where)
        _expect(
            vdtype in SUPPORTED_DTYPES,
            f"{where}.dtype '{vdtype}' is not one of {SUPPORTED_DTYPES}.",
        )
        index = _field(spec, "index", int, where)
        _expect(0 <= index < MAX_FILES, f"{where}.index out of range.")
    _expect(
        mode != "preset" or not variables,
        "'weights.mode' is 'preset' but variables are listed.",
    )
    files = _field(manifest, "files", dict, "manifest")
    _expect(len(files) <= MAX_FILES, "too many files listed.")
    for rel, entry in files.items():
        _expect(0 < len(rel) < 1000, "a file name has a bad length.")
        where = f"files['{rel}']"
        digest = _field(entry, "sha256", str, where)
        _expect(_is_sha256(digest), f"{where}.sha256 is not a hex SHA-256.")
        size = _field(entry, "bytes", int, where)
        _expect(size >= 0, f"{where}.bytes is negative.")
        _expect(size <= MAX_FILE_BYTES, f"{where}.bytes is out of range.")
    return manifest


def _is_sha256(digest):
    return (
        isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )


def read_manifest(directory):
    """Reads and validates `manifest.json` of an artifact directory.

    Raises:
        ArtifactError: if the directory or manifest is missing or invalid.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ArtifactError(
            f"'{directory}' is not a directory. Pass the directory written "
            "by `export_vllm()`."
        )
    path = os.path.join(directory, MANIFEST_FILE)
    if os.path.islink(path):
        raise ArtifactError(
            f"'{path}' is a symbolic link. Artifacts hold plain files only; "
            "copy the artifact instead of linking its files."
        )
    if not os.path.isfile(path):
        raise ArtifactError(
            f"'{directory}' has no {MANIFEST_FILE}: it is not a keras-vllm "
            "artifact, or its export did not finish. Export again with "
            "`model.export_vllm(path)`."
        )
    manifest = read_json(path, MAX_MANIFEST_BYTES, MANIFEST_FILE)
    return validate_manifest(manifest)


def verify_files(directory, manifest, only=None, verbose=False):
    """Checks that the artifact's files are exactly those the manifest lists,
    with matching sizes and SHA-256 digests.

    Args:
        directory: the artifact directory.
        manifest: its validated manifest.
        only: a tuple of path prefixes; when given, only files under them
            are hashed
            (every file is still listed, size-checked and link-checked).
        verbose: progress of the hashing (see `keras_vllm.progress`).

    Raises:
        IntegrityError: naming the first file that is missing, extra,
            resized or altered.
    """
    listed = manifest["files"]
    # Links and special files first: refused without following or opening
    # them (a FIFO would block a reader).
    present = set(list_files(directory)) - {MANIFEST_FILE}
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
        full = os.path.join(directory, rel)
        expected = listed[rel]
        if os.path.getsize(full) != expected["bytes"]:
            raise IntegrityError(
                f"Artifact file '{rel}' has {os.path.getsize(full)} bytes, "
                f"the manifest records {expected['bytes']}. The file is "
                "truncated or altered; copy the artifact again or re-export."
            )
    hashed = [
        rel for rel in sorted(listed) if only is None or rel.startswith(only)
    ]
    with progress.phase(
        "verifying checksums",
        total=sum(listed[rel]["bytes"] for rel in hashed),
        unit="bytes",
        verbose=verbose,
    ):
        for rel in hashed:
            if sha256_file(os.path.join(directory, rel)) != listed[rel]["sha256"]:
                raise IntegrityError(
                    f"Artifact file '{rel}' does not match its SHA-256 "
                    "checksum. The file is corrupt or altered; copy the "
                    "artifact again or re-export."
                )


def open_artifact(directory, verify=True, verbose=False, only=None):
    """Reads the manifest and (by default) verifies every file's checksum.

    Args:
        directory: path of an artifact directory.
        verify: whether to check file sizes and checksums.
        verbose: progress of the verification (see `keras_vllm.progress`);
            off by default, for the many processes that re-open an artifact.
        only: a tuple of path prefixes of the files to hash (see
            `verify_files`), for readers of part of an artifact; None
            hashes every file.

    Returns:
        The validated manifest dict.
    """
    manifest = read_manifest(directory)
    if verify:
        verify_files(os.fspath(directory), manifest, only, verbose)
    return manifest
