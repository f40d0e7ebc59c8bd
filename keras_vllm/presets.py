"""Preset references: which files of a preset an artifact depends on.

An artifact that does not store every weight points at the KerasHub preset
it was fine-tuned from (a local directory, or a `kaggle://` / `hf://`
handle that keras-hub resolves where a network or cache exists) and records
the SHA-256 of each preset file it uses, so a later load proves it uses the
same base weights.
"""

import os

from keras_vllm.format import sha256_file
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import PresetUnavailableError

# The files of a KerasHub preset that define a backbone's weights.
_CONFIG = "config.json"
_WEIGHTS = "model.weights.h5"
_SHARDED_WEIGHTS = "model.weights.json"


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


def backbone_files(handle):
    """Lists the preset files that hold the backbone config and weights."""
    from keras_hub.src.utils.preset_utils import check_file_exists

    files = [_CONFIG]
    if check_file_exists(handle, _SHARDED_WEIGHTS):
        import json

        with open(_preset_file(handle, _SHARDED_WEIGHTS)) as f:
            index = json.load(f)
        shards = sorted(set(index.get("weight_map", {}).values()))
        files += [_SHARDED_WEIGHTS] + shards
    else:
        files.append(_WEIGHTS)
    return files


def hash_preset(handle):
    """Returns `{file_name: sha256}` for the preset's backbone files."""
    return {
        name: sha256_file(_preset_file(handle, name))
        for name in backbone_files(handle)
    }


def check_preset(handle, expected):
    """Checks that a preset still has the content recorded at export.

    Raises:
        PresetUnavailableError: if the preset cannot be resolved.
        IntegrityError: if a preset file differs from the recorded hash.
    """
    for name, digest in sorted(expected.items()):
        path = _preset_file(handle, name)
        if sha256_file(path) != digest:
            raise IntegrityError(
                f"Preset file '{name}' of '{handle}' differs from the one "
                "this artifact was exported against, so its base weights "
                "are not the same. Point to the original preset, or "
                "re-export with `weights='full'`."
            )


def describe(handle):
    """A short human-readable form of a preset handle."""
    if os.path.isdir(handle):
        return f"local directory {os.path.abspath(handle)}"
    return handle
