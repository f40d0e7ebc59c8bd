"""Path-like fields of an artifact: nothing may name a file outside it.

The artifact's own file references are confined by `files.safe_join`.
This module checks the fields that other libraries would turn into paths:

- keras-hub tokenizers take their assets through config keys (`proto`,
  `vocabulary`, `merges`); a string there is a path keras-hub opens, so in
  any config of an artifact these keys must be null (the assets are the
  files in `tokenizer/assets/`);
- a preset reference names the preset files the backbone reads: only the
  names `Backbone.from_preset` reads, and all of them (a delta artifact
  must pin its config and every weight file);
- a sharded preset's weight index names its shards: plain shard names,
  each pinned.

Plain Python; see docs/FORMAT.md ("Trust").
"""

import re

from keras_vllm.format.checks import fail
from keras_vllm.format.names import ASSET_CONFIG_KEYS
from keras_vllm.format.names import MAX_CONFIG_DEPTH
from keras_vllm.format.names import PRESET_CONFIG_FILE
from keras_vllm.format.names import PRESET_SHARD_PATTERN
from keras_vllm.format.names import PRESET_SHARDED_INDEX_FILE
from keras_vllm.format.names import PRESET_WEIGHTS_FILE

_SHARD = re.compile(PRESET_SHARD_PATTERN)

# `config_file` of each role: keras-hub's default names, the only ones an
# export writes (keras-vllm never reads them, but a path there would be one
# more field pointing somewhere).
_CONFIG_FILE_NAMES = {
    "tokenizer": "tokenizer.json",
    "preprocessor": "preprocessor.json",
}


def is_preset_file_name(name):
    """Whether `name` is a preset file a backbone's `from_preset` reads."""
    return isinstance(name, str) and (
        name in (PRESET_CONFIG_FILE, PRESET_WEIGHTS_FILE, PRESET_SHARDED_INDEX_FILE)
        or _SHARD.fullmatch(name) is not None
    )


def check_asset_fields(value, where, depth=0):
    """Refuses a non-null asset key (`proto`, `vocabulary`, `merges`) at any
    depth of a config: keras-hub would read a string there as a file path.

    Raises:
        ArtifactError: naming the field.
    """
    if depth > MAX_CONFIG_DEPTH:
        fail(f"Invalid manifest: '{where}' is nested too deeply.")
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ASSET_CONFIG_KEYS and item is not None:
                fail(
                    f"Invalid manifest: '{where}.{key}' is set "
                    f"({type(item).__name__} {str(item)[:80]!r}); a keras-hub "
                    "tokenizer would read it as a file path or inline asset. "
                    "An artifact's tokenizer assets are the files in "
                    "tokenizer/assets/, so this field must be null; the "
                    "artifact was altered, re-export it."
                )
            check_asset_fields(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_asset_fields(item, f"{where}[{i}]", depth + 1)


def check_config_file_field(config, role, where):
    """`config_file` of a tokenizer/preprocessor config: keras-hub's name."""
    expected = _CONFIG_FILE_NAMES.get(role)
    if expected is None or "config_file" not in config:
        return
    if config["config_file"] != expected:
        fail(
            f"Invalid manifest: '{where}.config_file' is "
            f"{str(config['config_file'])[:100]!r}; keras-hub writes "
            f"'{expected}' there and an artifact holds no other. Re-export "
            "the model."
        )


def check_preset_reference(preset, mode):
    """The preset files a manifest pins: names the backbone reads, and for a
    delta or preset artifact all of them.

    Args:
        preset: the manifest's `preset` (validated structure) or None.
        mode: `weights.mode`.

    Raises:
        ArtifactError: naming the file and the fix.
    """
    if preset is None:
        return
    names = set(preset["files"])
    for name in sorted(names):
        if not is_preset_file_name(name):
            fail(
                f"Invalid manifest: 'preset.files' names '{name[:100]}', "
                "which a KerasHub backbone does not read (only "
                f"{PRESET_CONFIG_FILE}, {PRESET_WEIGHTS_FILE}, or "
                f"{PRESET_SHARDED_INDEX_FILE} and its model_NNNNN.weights.h5 "
                "shards). The manifest was altered; re-export the model."
            )
    if mode == "full":
        return
    shards = {n for n in names if _SHARD.fullmatch(n)}
    single = PRESET_WEIGHTS_FILE in names
    indexed = PRESET_SHARDED_INDEX_FILE in names
    problem = None
    if PRESET_CONFIG_FILE not in names:
        problem = f"does not pin the preset's {PRESET_CONFIG_FILE}"
    elif single == indexed:
        problem = (
            "pins no weight file"
            if not single
            else f"pins both {PRESET_WEIGHTS_FILE} and "
            f"{PRESET_SHARDED_INDEX_FILE}"
        )
    elif indexed and not shards:
        problem = f"pins {PRESET_SHARDED_INDEX_FILE} but none of its shards"
    elif single and shards:
        problem = f"pins shards beside {PRESET_WEIGHTS_FILE}"
    if problem is not None:
        fail(
            f"Invalid manifest: a '{mode}' artifact takes weights from its "
            f"preset, so 'preset.files' must pin every preset file the "
            f"backbone reads, but it {problem}. The manifest was altered; "
            "re-export the model."
        )


def check_sharded_index(index, pinned, where=PRESET_SHARDED_INDEX_FILE):
    """A sharded preset's weight index: every shard it names is a plain
    shard name, and the pinned shards are exactly those it names.

    Args:
        index: the parsed index (JSON).
        pinned: the names the artifact pins (`preset.files`).
        where: how messages name the index.

    Returns:
        The sorted shard names.
    """
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        fail(f"The preset's {where} has no 'weight_map' object.")
    shards = set()
    for key, value in weight_map.items():
        for name in value if isinstance(value, list) else [value]:
            if not isinstance(name, str) or _SHARD.fullmatch(name) is None:
                fail(
                    f"The preset's {where} maps '{str(key)[:100]}' to "
                    f"{str(name)[:100]!r}, not a shard file of the preset "
                    "(model_NNNNN.weights.h5). Use the original preset."
                )
            shards.add(name)
    pinned_shards = {n for n in pinned if _SHARD.fullmatch(n)}
    if shards != pinned_shards:
        diff = sorted(shards ^ pinned_shards)
        fail(
            f"The preset's {where} names other shards than the artifact "
            f"pins (e.g. '{diff[0]}'). Use the preset the artifact was "
            "exported from, or re-export with `weights='full'`."
        )
    return sorted(shards)
