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
from keras_vllm.format.names import HF_SHARD_PATTERN
from keras_vllm.format.names import HF_SHARDED_INDEX_FILE
from keras_vllm.format.names import HF_WEIGHTS_FILE
from keras_vllm.format.names import MAX_CONFIG_DEPTH
from keras_vllm.format.names import PRESET_CONFIG_FILE
from keras_vllm.format.names import PRESET_SHARD_PATTERN
from keras_vllm.format.names import PRESET_SHARDED_INDEX_FILE
from keras_vllm.format.names import PRESET_WEIGHTS_FILE

_SHARD = re.compile(PRESET_SHARD_PATTERN)
_HF_SHARD = re.compile(HF_SHARD_PATTERN)

# The two ways a preset holds a backbone's weights, per on-disk format:
# (single file, index, shard pattern, shard description).
_LAYOUTS = {
    "keras": (
        PRESET_WEIGHTS_FILE, PRESET_SHARDED_INDEX_FILE, _SHARD,
        "model_NNNNN.weights.h5",
    ),
    "transformers": (
        HF_WEIGHTS_FILE, HF_SHARDED_INDEX_FILE, _HF_SHARD,
        "*.safetensors",
    ),
}


def _is_shard(name, layout):
    single, _, pattern, _ = _LAYOUTS[layout]
    return name != single and pattern.fullmatch(name) is not None


def pinned_layout(names):
    """The preset format (`"keras"` or `"transformers"`) whose weight files
    `names` pins, or None when it pins none (a full export's reference)."""
    for layout, (single, index, _, _) in _LAYOUTS.items():
        if single in names or index in names or any(
            _is_shard(n, layout) for n in names
        ):
            return layout
    return None


# `config_file` of each role: keras-hub's default names, the only ones an
# export writes (keras-vllm never reads them, but a path there would be one
# more field pointing somewhere).
_CONFIG_FILE_NAMES = {
    "tokenizer": "tokenizer.json",
    "preprocessor": "preprocessor.json",
}


def is_preset_file_name(name):
    """Whether `name` is a preset file a backbone's `from_preset` reads: a
    KerasHub preset's or a Hugging Face checkpoint's config and weights."""
    return isinstance(name, str) and (
        name == PRESET_CONFIG_FILE
        or any(
            name in (single, index) or _is_shard(name, layout)
            for layout, (single, index, _, _) in _LAYOUTS.items()
        )
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
    delta or preset artifact all of them, of one preset format.

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
                f"shards; or a Hugging Face checkpoint's {HF_WEIGHTS_FILE}, "
                f"or {HF_SHARDED_INDEX_FILE} and its .safetensors shards). "
                "The manifest was altered; re-export the model."
            )
    if mode == "full":
        return
    layout = pinned_layout(names) or "keras"
    single_name, index_name, _, _ = _LAYOUTS[layout]
    shards = {n for n in names if _is_shard(n, layout)}
    single = single_name in names
    indexed = index_name in names
    others = names - shards - {single_name, index_name, PRESET_CONFIG_FILE}
    problem = None
    if PRESET_CONFIG_FILE not in names:
        problem = f"does not pin the preset's {PRESET_CONFIG_FILE}"
    elif others:
        problem = (
            f"mixes the files of two preset formats (e.g. "
            f"'{sorted(others)[0]}' beside '{single_name}' or "
            f"'{index_name}')"
        )
    elif single == indexed:
        problem = (
            "pins no weight file"
            if not single
            else f"pins both {single_name} and {index_name}"
        )
    elif indexed and not shards:
        problem = f"pins {index_name} but none of its shards"
    elif single and shards:
        problem = f"pins shards beside {single_name}"
    if problem is not None:
        fail(
            f"Invalid manifest: a '{mode}' artifact takes weights from its "
            f"preset, so 'preset.files' must pin every preset file the "
            f"backbone reads, but it {problem}. The manifest was altered; "
            "re-export the model."
        )


def check_sharded_index(index, pinned, where=PRESET_SHARDED_INDEX_FILE,
                        layout="keras"):
    """A sharded preset's weight index: every shard it names is a plain
    shard name, and the pinned shards are exactly those it names.

    Args:
        index: the parsed index (JSON).
        pinned: the names the artifact pins (`preset.files`).
        where: how messages name the index.
        layout: the preset format, `"keras"` or `"transformers"`.

    Returns:
        The sorted shard names.
    """
    describe = _LAYOUTS[layout][3]
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        fail(f"The preset's {where} has no 'weight_map' object.")
    shards = set()
    for key, value in weight_map.items():
        for name in value if isinstance(value, list) else [value]:
            if not isinstance(name, str) or not _is_shard(name, layout):
                fail(
                    f"The preset's {where} maps '{str(key)[:100]}' to "
                    f"{str(name)[:100]!r}, not a shard file of the preset "
                    f"({describe}). Use the original preset."
                )
            shards.add(name)
    pinned_shards = {n for n in pinned if _is_shard(n, layout)}
    if shards != pinned_shards:
        diff = sorted(shards ^ pinned_shards)
        fail(
            f"The preset's {where} names other shards than the artifact "
            f"pins (e.g. '{diff[0]}'). Use the preset the artifact was "
            "exported from, or re-export with `weights='full'`."
        )
    return sorted(shards)
