"""Preset references: which files of a preset an artifact depends on.

An artifact that does not store every weight points at the KerasHub preset
it was fine-tuned from (a local directory, or a `kaggle://` / `hf://`
handle that keras-hub resolves where a network or cache exists) and records
the SHA-256 of each preset file it uses, so a later load proves it uses the
same base weights.
"""

import os

from keras_vllm import format as fmt
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import PresetUnavailableError
from keras_vllm.format import references
from keras_vllm.format import sha256_file
from keras_vllm.format import weight_tree

# The files of a KerasHub preset that define a backbone's weights.
_CONFIG = fmt.PRESET_CONFIG_FILE
_WEIGHTS = fmt.PRESET_WEIGHTS_FILE
_SHARDED_WEIGHTS = fmt.PRESET_SHARDED_INDEX_FILE


def _preset_file(handle, name, for_engine=False):
    from keras_hub.src.utils.preset_utils import get_file

    try:
        return get_file(handle, name)
    except Exception as e:  # keras-hub raises many types for a bad handle
        if for_engine:
            how = (
                "copy the preset directory to this machine and pass its path "
                "(`--preset DIR` on the command line, `preset=` in Python, "
                "`KERAS_VLLM_PRESET=DIR` for plain `vllm serve`)"
                if not _is_remote(handle)
                else "warm keras-hub's cache on this machine with "
                f"`keras_hub.models.Backbone.from_preset('{handle}')` where "
                "the network exists (and set KAGGLEHUB_CACHE / HF_HOME to "
                "the copied cache)"
            )
            hint = (
                f"To serve it offline, {how}, or re-export the model with "
                "`weights='full'` so the artifact needs no preset."
            )
        else:
            hint = (
                "On a machine without network access, copy the preset "
                "directory to this machine and pass its path (e.g. "
                "`load_causal_lm(path, preset='/models/my_preset')`, or "
                "`--preset DIR` on the command line), or warm "
                "keras-hub's cache with "
                "`keras_hub.models.Backbone.from_preset(handle)` where the "
                "network exists, or export with `weights='full'`."
            )
        cause = " ".join(str(e).split())[:300]
        raise PresetUnavailableError(
            f"The preset '{handle}' that this artifact references is not "
            f"available here. {hint} (Cause: {type(e).__name__}: {cause})"
        ) from None


def resolve_handle(handle):
    """A preset reference as an artifact records it: a local preset
    directory as an absolute path (so it resolves from any working
    directory); hub handles (`kaggle://`, `hf://`, bare names) as given."""
    handle = os.fspath(handle)
    if not _is_remote(handle) and os.path.isdir(handle):
        return os.path.abspath(handle)
    return handle


def _is_remote(handle):
    return "://" in handle


def check_available(handle, names):
    """Checks that a preset and the named files resolve here, without
    hashing them (the engine process hashes them when it loads weights).

    Raises:
        PresetUnavailableError: naming the handle and how to make it
            available offline.
    """
    for name in names:
        _preset_file(handle, name, for_engine=True)


def backbone_files(handle, pinned=None):
    """Lists the preset files that hold the backbone config and weights:
    those `Backbone.from_preset` reads (`model.weights.h5` when present,
    else the sharded index and the shards it names).

    Args:
        handle: the preset.
        pinned: the names an artifact pins; when given, the sharded index's
            shards must be exactly the pinned ones.
    """
    from keras_hub.src.utils.preset_utils import check_file_exists

    # Resolves the handle first: an unknown one fails with how to fix it.
    _preset_file(handle, _CONFIG)
    files = [_CONFIG]
    # keras-hub's own order: a single weights file wins over an index.
    if not check_file_exists(handle, _WEIGHTS) and check_file_exists(
        handle, _SHARDED_WEIGHTS
    ):
        index = fmt.read_json(
            _preset_file(handle, _SHARDED_WEIGHTS),
            fmt.MAX_MANIFEST_BYTES,
            f"{_SHARDED_WEIGHTS} of the preset '{handle}'",
            follow=True,
        )
        if pinned is None:
            pinned = [
                v
                for value in (index.get("weight_map") or {}).values()
                for v in (value if isinstance(value, list) else [value])
                if isinstance(v, str)
            ]
        files += [_SHARDED_WEIGHTS] + references.check_sharded_index(
            index, pinned, f"{_SHARDED_WEIGHTS} of '{handle}'"
        )
    else:
        files.append(_WEIGHTS)
    return files


def hash_preset(handle):
    """Returns `{file_name: sha256}` for the preset's backbone files."""
    return {
        name: sha256_file(_preset_file(handle, name))
        for name in backbone_files(handle)
    }


def check_preset(handle, expected, backbone=None):
    """Checks that a preset still has the content recorded at export.

    Every file the backbone will read from the preset must be pinned (a
    `model.weights.h5` beside pinned shards would be read instead of them),
    be a regular file and hash to the recorded value. With `backbone` (the
    manifest's backbone section), the preset's config must describe that
    backbone, and the parameter count it implies must fit the preset's
    weight files, before anything is built.

    Raises:
        PresetUnavailableError: if the preset cannot be resolved.
        IntegrityError: if a preset file differs from the recorded hash, or
            the preset holds another backbone.
        ArtifactError: if the preset would be read beyond what is pinned.
    """
    read = set(backbone_files(handle, pinned=sorted(expected)))
    if read != set(expected):
        diff = sorted(read ^ set(expected))
        raise IntegrityError(
            f"The preset '{handle}' loads through '{diff[0]}', which the "
            "artifact does not pin (or pins a file the backbone does not "
            "read): its backbone would not be the one the artifact was "
            "exported against. Point to the original preset, or re-export "
            "with `weights='full'`."
        )
    weight_bytes = 0
    for name, digest in sorted(expected.items()):
        path = _preset_file(handle, name)
        size = fmt.files.regular_file_size(
            path, f"Preset file '{name}' of '{handle}'"
        )
        if name != _CONFIG and name != _SHARDED_WEIGHTS:
            weight_bytes += size
        if sha256_file(path) != digest:
            raise IntegrityError(
                f"Preset file '{name}' of '{handle}' differs from the one "
                "this artifact was exported against, so its base weights "
                "are not the same. Point to the original preset, or "
                "re-export with `weights='full'`."
            )
    if backbone is not None:
        _check_preset_config(handle, backbone, weight_bytes)


def _check_preset_config(handle, backbone, weight_bytes):
    """The (pinned) preset config describes the manifest's backbone."""
    config = fmt.read_json(
        _preset_file(handle, _CONFIG),
        fmt.MAX_SMALL_JSON_BYTES,
        f"{_CONFIG} of the preset '{handle}'",
        follow=True,
    )
    strip = lambda c: {k: v for k, v in c.items() if k not in ("dtype", "name")}
    if not (
        isinstance(config, dict)
        and config.get("registered_name") == backbone["registered_name"]
        and isinstance(config.get("config"), dict)
        and strip(config["config"]) == strip(backbone["config"])
    ):
        raise IntegrityError(
            f"The preset '{handle}' holds a different backbone than the one "
            "this artifact was exported from (its config.json differs from "
            "the manifest's backbone). Point to the original preset, or "
            "re-export with `weights='full'`."
        )
    fmt.configs.check_config_values(config["config"], "preset config")
    weight_tree.check_preset_size(
        fmt.configs.estimate_parameters(backbone["config"]),
        weight_bytes,
        handle,
    )


def describe(handle):
    """A short human-readable form of a preset handle."""
    if os.path.isdir(handle):
        return f"local directory {os.path.abspath(handle)}"
    return handle
