"""Preset references: which files of a preset an artifact depends on.

An artifact that does not store every weight points at the KerasHub preset
it was fine-tuned from (a local directory, or a `kaggle://` / `hf://`
handle that keras-hub resolves where a network or cache exists) and records
the SHA-256 of each preset file it uses, so a later load proves it uses the
same base weights. Both on-disk formats keras-hub loads are covered: a
KerasHub preset (`config.json` with `registered_name`, `model.weights.h5`
or its shards) and a Hugging Face checkpoint that keras-hub converts on
load (`config.json` with `model_type`, `model.safetensors` or
`model.safetensors.index.json` and its shards).
"""

import os

from keras_vllm import format as fmt
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import PresetUnavailableError
from keras_vllm.format import references
from keras_vllm.format.checks import fail
from keras_vllm.format import sha256_files
from keras_vllm.format import weight_tree

# The files of a KerasHub preset that define a backbone's weights.
_CONFIG = fmt.PRESET_CONFIG_FILE
_WEIGHTS = fmt.PRESET_WEIGHTS_FILE
_SHARDED_WEIGHTS = fmt.PRESET_SHARDED_INDEX_FILE
_HF_WEIGHTS = fmt.HF_WEIGHTS_FILE
_HF_SHARDED_WEIGHTS = fmt.HF_SHARDED_INDEX_FILE


def _get_file(handle, name):
    """keras-hub's `get_file`; a local directory (or a path to one that is
    gone) is resolved here, without importing keras-hub (seconds, with
    its TensorFlow), e.g. in `vllm serve`'s refusal check."""
    if not _is_remote(handle) and (
        os.path.isabs(handle) or os.path.isdir(handle)
    ):
        # As keras-hub's: whether it is a regular file is checked later,
        # with a message saying so.
        path = os.path.join(handle, name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"'{path}' does not exist")
        return path
    from keras_hub.src.utils.preset_utils import get_file

    return get_file(handle, name)


def _preset_file(handle, name, for_engine=False, for_export=False):
    try:
        return _get_file(handle, name)
    except Exception as e:  # keras-hub raises many types for a bad handle
        cause = " ".join(str(e).split())[:300]
        if for_export:
            raise PresetUnavailableError(
                f"The preset '{handle}' this model was loaded from is not "
                "available here (moved or deleted?), so the export cannot "
                "store only what changed against it. Pass its current "
                "location (`export_vllm(path, preset='/path/to/preset')`), "
                "or export with `weights='full'` so the artifact needs no "
                f"preset. (Cause: {type(e).__name__}: {cause})"
            ) from None
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


def _read_config(handle, for_export=False):
    return fmt.read_json(
        _preset_file(handle, _CONFIG, for_export=for_export),
        fmt.MAX_SMALL_JSON_BYTES,
        f"{_CONFIG} of the preset '{handle}'",
        follow=True,
    )


def read_config(handle):
    """The preset's `config.json` (a KerasHub or a Hugging Face one)."""
    return _read_config(handle)


def optional_file(handle, name):
    """The local path of a preset file, or None when the preset has none."""
    from keras_hub.src.utils.preset_utils import check_file_exists

    if not check_file_exists(handle, name):
        return None
    return _preset_file(handle, name)


def declared_max_positions(handle):
    """A Hugging Face checkpoint's `max_position_embeddings`, or None (a
    KerasHub preset, no such field, or a preset not readable here)."""
    try:
        config = read_config(handle)
    except Exception:  # only a default depends on it
        return None
    if not isinstance(config, dict) or "registered_name" in config:
        return None
    value = config.get("max_position_embeddings")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def preset_format(config):
    """The on-disk format of a preset, by keras-hub's own rule on its
    `config.json`: `"keras"` (a serialized Keras object) or
    `"transformers"` (a Hugging Face checkpoint keras-hub converts).

    Raises:
        ArtifactError: for any other config (keras-vllm pins no other
            format's files).
    """
    if isinstance(config, dict) and "registered_name" in config:
        return "keras"
    if isinstance(config, dict) and "model_type" in config:
        return "transformers"
    fail(
        f"The preset's {_CONFIG} is neither a KerasHub preset config (no "
        "'registered_name') nor a Hugging Face config (no 'model_type'), so "
        "keras-vllm cannot pin the files its weights come from. Export with "
        "`weights='full'`."
    )


def backbone_files(handle, pinned=None, for_export=False):
    """Lists the preset files that hold the backbone config and weights:
    those `Backbone.from_preset` reads. For a KerasHub preset,
    `model.weights.h5` when present, else the sharded index and the shards
    it names; for a Hugging Face checkpoint, `model.safetensors.index.json`
    and the shards it names when present, else `model.safetensors`
    (keras-hub's converter prefers the index).

    Args:
        handle: the preset.
        pinned: the names an artifact pins; when given, the sharded index's
            shards must be exactly the pinned ones.
        for_export: a missing preset's error says how to export instead
            of how to load.
    """
    from keras_hub.src.utils.preset_utils import check_file_exists

    # Resolves the handle first: an unknown one fails with how to fix it.
    layout = preset_format(_read_config(handle, for_export=for_export))
    files = [_CONFIG]
    if layout == "keras":
        single, index_name = _WEIGHTS, _SHARDED_WEIGHTS
        # keras-hub's own order: a single weights file wins over an index.
        use_index = not check_file_exists(
            handle, _WEIGHTS
        ) and check_file_exists(handle, _SHARDED_WEIGHTS)
    else:
        single, index_name = _HF_WEIGHTS, _HF_SHARDED_WEIGHTS
        # keras-hub's SafetensorLoader: an index wins over a single file.
        use_index = check_file_exists(handle, _HF_SHARDED_WEIGHTS)
    if not use_index:
        return files + [single]
    index = fmt.read_json(
        _preset_file(handle, index_name),
        fmt.MAX_MANIFEST_BYTES,
        f"{index_name} of the preset '{handle}'",
        follow=True,
    )
    if pinned is None:
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        pinned = [
            v
            for value in (weight_map or {}).values()
            for v in (value if isinstance(value, list) else [value])
            if isinstance(v, str)
        ]
    return files + [index_name] + references.check_sharded_index(
        index, pinned, f"{index_name} of '{handle}'", layout
    )


def hash_preset(handle):
    """Returns `{file_name: sha256}` for the preset's backbone files."""
    names = backbone_files(handle, for_export=True)
    digests = sha256_files(
        _preset_file(handle, name, for_export=True) for name in names
    )
    return dict(zip(names, digests))


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
    names = sorted(expected)
    paths = [_preset_file(handle, name) for name in names]
    for name, path in zip(names, paths):
        size = fmt.files.regular_file_size(
            path, f"Preset file '{name}' of '{handle}'"
        )
        if name not in (_CONFIG, _SHARDED_WEIGHTS, _HF_SHARDED_WEIGHTS):
            weight_bytes += size
    for name, digest in zip(names, sha256_files(paths)):
        if digest != expected[name]:
            raise IntegrityError(
                f"Preset file '{name}' of '{handle}' differs from the one "
                "this artifact was exported against (its SHA-256 is not "
                "the one 'preset.files' pins), so its base weights are not "
                "the same. Point to the original preset (`preset=` in "
                "Python, `--preset DIR` on the command line), or re-export "
                "with `weights='full'`."
            )
    if backbone is not None:
        _check_preset_config(handle, backbone, weight_bytes)


def _check_preset_config(handle, backbone, weight_bytes):
    """The (pinned) preset config describes the manifest's backbone."""
    config = _read_config(handle)
    if preset_format(config) == "transformers":
        _check_transformers_config(handle, config, backbone)
    else:
        strip = lambda c: {
            k: v for k, v in c.items() if k not in ("dtype", "name")
        }
        if not (
            config.get("registered_name") == backbone["registered_name"]
            and isinstance(config.get("config"), dict)
            and strip(config["config"]) == strip(backbone["config"])
        ):
            raise IntegrityError(
                f"The preset '{handle}' holds a different backbone than the "
                "one this artifact was exported from (its config.json "
                "differs from the manifest's backbone). Point to the "
                "original preset, or re-export with `weights='full'`."
            )
        fmt.configs.check_config_values(config["config"], "preset config")
    weight_tree.check_preset_size(
        fmt.configs.estimate_parameters(backbone["config"]),
        weight_bytes,
        handle,
    )


def _check_transformers_config(handle, config, backbone):
    """A Hugging Face config converts (by keras-hub's converter, plain
    Python: nothing is built) to the manifest's backbone class. The full
    config is compared once keras-hub has built the backbone."""
    import keras
    from keras_hub.src.utils.transformers.preset_loader import (
        TransformersPresetLoader,
    )

    try:
        cls = TransformersPresetLoader(handle, config).check_backbone_class()
        name = keras.saving.get_registered_name(cls)
    except Exception as e:  # keras-hub raises ValueError and others
        raise IntegrityError(
            f"The Hugging Face checkpoint '{handle}' has a config.json "
            f"keras-hub cannot convert ({type(e).__name__}: "
            f"{str(e)[:200]}). Point to the original preset, or re-export "
            "with `weights='full'`."
        ) from None
    if name != backbone["registered_name"]:
        raise IntegrityError(
            f"The Hugging Face checkpoint '{handle}' converts to a {name}, "
            f"not the artifact's {backbone['registered_name']} (its "
            "config.json is another model's). Point to the original preset, "
            "or re-export with `weights='full'`."
        )


def describe(handle):
    """A short human-readable form of a preset handle."""
    if os.path.isdir(handle):
        return f"local directory {os.path.abspath(handle)}"
    return handle
