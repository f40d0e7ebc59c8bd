"""The manifest: its writer and its reader, side by side.

`new_manifest()` is the only place a manifest is assembled (the exporter
passes the sections it computed); `validate_manifest()` checks every field
a reader relies on (types, ranges, bounded sizes) and names the field and
what was expected, so a hand-edited or hostile manifest fails with a
message, not deep in JAX. Cross-file checks live in
`keras_vllm.format.consistency`.
"""

import datetime
import hashlib
import json
import math
import os
import re

from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import SignatureError
from keras_vllm.errors import VersionSkewError
from keras_vllm.format.files import read_json
from keras_vllm.format import adapter
from keras_vllm.format import quantization
from keras_vllm.format import file_table
from keras_vllm.format import image_settings
from keras_vllm.format.checks import field as _field
from keras_vllm.format.checks import invalid_unless as _expect
from keras_vllm.format.checks import is_sha256
from keras_vllm.format.quantization import QUANTIZED_VARIABLE_DTYPES
from keras_vllm.format.names import ASSISTANT_FORMAT_NAME
from keras_vllm.format.names import FORMAT_NAME
from keras_vllm.format.names import FORMAT_VERSION
from keras_vllm.format.names import GOLDEN_REFERENCES
from keras_vllm.format.names import LORA_STORAGE
from keras_vllm.format.names import MANIFEST_FIELDS
from keras_vllm.format.names import MANIFEST_FILE
from keras_vllm.format.names import MAX_DIM
from keras_vllm.format.names import MAX_ELEMENTS
from keras_vllm.format.names import MAX_FILES
from keras_vllm.format.names import MAX_MANIFEST_BYTES
from keras_vllm.format.names import SERVED_MODALITIES
from keras_vllm.format.names import SUPPORTED_DTYPES
from keras_vllm.format.names import WEIGHT_MODES
from keras_vllm.format.names import WEIGHTS_DIR

_PRESET_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


def tokenizer_fingerprint(asset_digests, config):
    """The tokenizer's identity: its asset names and digests and its config.

    Args:
        asset_digests: `{asset_file_name: sha256_hex}`.
        config: the tokenizer's Keras config (a JSON object).

    Returns:
        A hex SHA-256. Export records it; readers recompute it from the
        manifest's file table, so a tokenizer swapped in from another model
        is refused even when its files carry fresh checksums.
    """
    digest = hashlib.sha256()
    for name in sorted(asset_digests):
        digest.update(name.encode())
        digest.update(asset_digests[name].encode())
    digest.update(json.dumps(config, sort_keys=True).encode())
    return digest.hexdigest()


def new_manifest(*, written_by, preset, dtype, stop_token_ids,
                 max_sequence_length, sampler_in_vllm, unservable_reason,
                 parameter_count, weights, sections, files,
                 golden_reference="generate", quantization=None,
                 adapter=None, unserved_inputs=(), prefix_caching=True,
                 image=None):
    """Assembles a manifest of this format version (see docs/FORMAT.md).

    Args:
        written_by: `{package: version}` of the writing environment.
        preset: `{"handle", "files"}` or None.
        dtype: the backbone's variable dtype name.
        stop_token_ids: list of ints.
        max_sequence_length: the served sequence length.
        sampler_in_vllm: whether vLLM reproduces the model's sampler.
        unservable_reason: None for a servable artifact, else why not.
        parameter_count: the backbone's parameter count.
        weights: the `weights` section (mode, variables, ...).
        sections: `{"backbone", "causal_lm", "tokenizer", "preprocessor",
            "sampler"}` serialized Keras objects.
        files: the file table (`files.file_table`).
        golden_reference: how `golden.json` was computed in Keras (one of
            `GOLDEN_REFERENCES`).
        quantization: the `quantization` section of a Keras-quantized
            model (`keras_vllm.format.quantization`), else None.
        adapter: the `adapter` section of a LoRA adapter artifact
            (`keras_vllm.format.adapter`), else None.
        unserved_inputs: the backbone's inputs the served model does not
            take (an encoder's: the artifact serves its text decoder).
        prefix_caching: whether vLLM may reuse cached KV blocks across
            requests (False when a paged layer's keys depend on the
            sequence's length: `PagedAttention.prefix_cacheable`).
        image: how the model takes images (`modalities.image`,
            `keras_vllm.format.image_settings`), or None.

    Returns:
        The validated manifest dict.
    """
    manifest = {
        "format": FORMAT_NAME,
        "format_version": list(FORMAT_VERSION),
        "written_by": dict(written_by),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "preset": preset,
        "dtype": dtype,
        "stop_token_ids": list(stop_token_ids),
        "max_sequence_length": int(max_sequence_length),
        "sampler_in_vllm": bool(sampler_in_vllm),
        "servable": unservable_reason is None,
        "unservable_reason": unservable_reason,
        "parameter_count": int(parameter_count),
        "weights": weights,
        **sections,
        "golden_reference": golden_reference,
        "modalities": {
            # Images are served (1.10) when the family says how they enter.
            "served": ["text"] if image is None else ["text", "image"],
            "unserved_inputs": sorted(unserved_inputs),
        },
        "prefix_caching": bool(prefix_caching),
        "files": files,
    }
    if image is not None:
        manifest["modalities"]["image"] = image
    if quantization is not None:
        manifest["quantization"] = quantization
    if adapter is not None:
        manifest["adapter"] = adapter
    return validate_manifest(manifest)


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
    _expect(
        fmt != ASSISTANT_FORMAT_NAME,
        "it is an assistant artifact (a speculative drafter, read by "
        "`keras_vllm.load_assistant()`), not a model: pass the target "
        "artifact, with the assistant as speculative_config's 'model'.",
    )
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
    for key in ("servable", "sampler_in_vllm", "prefix_caching"):
        if key in manifest:
            _field(manifest, key, bool, "manifest")
    _expect(
        "prefix_caching" not in manifest or tuple(version) >= (1, 8),
        "'prefix_caching' is a format 1.8 field, but the artifact declares "
        f"{version[0]}.{version[1]}.",
    )
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
                is_sha256(digest),
                "'preset.files' must map file names to SHA-256 strings.",
            )
    if "golden_reference" in manifest:
        reference = _field(manifest, "golden_reference", str, "manifest")
        _expect(
            reference in GOLDEN_REFERENCES,
            f"'golden_reference' is '{reference[:50]}', expected one of "
            f"{GOLDEN_REFERENCES}.",
        )
    if "modalities" in manifest:
        _validate_modalities(manifest)
    weights = _field(manifest, "weights", dict, "manifest")
    mode = _field(weights, "mode", str, "weights")
    _expect(
        mode in WEIGHT_MODES,
        f"'weights.mode' is '{mode}', expected one of {WEIGHT_MODES}.",
    )
    _expect(
        mode in ("full", "adapter") or preset is not None,
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
        weights.get("lora", "merged") in LORA_STORAGE,
        f"'weights.lora' must be one of {LORA_STORAGE}.",
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
            vdtype in SUPPORTED_DTYPES + QUANTIZED_VARIABLE_DTYPES,
            f"{where}.dtype '{vdtype}' is not one of "
            f"{SUPPORTED_DTYPES + QUANTIZED_VARIABLE_DTYPES}.",
        )
        index = _field(spec, "index", int, where)
        _expect(0 <= index < MAX_FILES, f"{where}.index out of range.")
    # The stored checkpoint's size, which readers report progress against.
    _expect(
        not variables or "bytes" in weights,
        "'weights.bytes' is missing; an export that stores variables "
        "records their size there. Re-export the model.",
    )
    _expect(
        mode != "preset" or not variables,
        "'weights.mode' is 'preset' but variables are listed.",
    )
    quantization.validate(manifest)
    adapter.validate(manifest)
    file_table.validate(manifest)
    return manifest


def _validate_modalities(manifest):
    modalities = _field(manifest, "modalities", dict, "manifest")
    served = _field(modalities, "served", list, "modalities")
    _expect(
        "text" in served and all(m in SERVED_MODALITIES for m in served),
        f"'modalities.served' must list 'text' and only {SERVED_MODALITIES}.",
    )
    if "image" in served:
        _expect(
            tuple(manifest["format_version"]) >= (1, 10)
            and "image" in modalities,
            "'modalities.served' lists 'image', a format 1.10 value that "
            "needs 'modalities.image'.",
        )
    unserved = _field(modalities, "unserved_inputs", list, "modalities")
    _expect(
        len(unserved) <= 64
        and all(isinstance(n, str) and 0 < len(n) < 200 for n in unserved),
        "'modalities.unserved_inputs' must be a short list of input names.",
    )
    image_settings.validate(modalities, manifest["format_version"])


def read_manifest(directory, sha256=None):
    """Reads and validates `manifest.json` of an artifact directory.

    Args:
        directory: the artifact directory.
        sha256: the digest the manifest's bytes must have (the one a
            verified signature vouches for), checked on the bytes parsed.

    Raises:
        ArtifactError: if the directory or manifest is missing or invalid.
        SignatureError: the manifest is not the one `sha256` names.
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
    try:
        manifest = read_json(path, MAX_MANIFEST_BYTES, MANIFEST_FILE,
                             sha256=sha256)
    except IntegrityError:
        raise SignatureError(
            f"'{path}' changed after its signature was verified: its bytes "
            "as read now are not the signed ones. Do not edit the artifact "
            "while it is read; copy it again from where it was signed."
        ) from None
    return validate_manifest(manifest)
