"""The weights index: the manifest's `weights.variables` and orbax's tree.

Checked before anything is allocated (plain Python, JSON only):

- every recorded path is a Keras variable path (`/`-separated names, so no
  `..` or absolute part can reach orbax or the file system), and every
  position (`index`) is claimed once; a full export claims each position
  of the backbone exactly once;
- the orbax tree metadata (`weights/_METADATA`) lists exactly these paths,
  as arrays stored in the one layout keras-vllm writes (OCDBT);
- the backbone config agrees with what is stored: its token embedding has
  the config's vocabulary and hidden sizes, and the parameter count the
  config implies is not far above the stored one (a config edited to build
  a much larger model than its weights fails here, in milliseconds, not in
  an out-of-memory error while building it).

The shapes and dtypes orbax records for each array are compared with the
manifest by the loader (`keras_vllm.hub.checkpoint.restore_weights`), which reads
orbax's own metadata before restoring.
"""

import math
import re

from keras_vllm.format import adapter
from keras_vllm.format import quantization
from keras_vllm.format.checks import fail
from keras_vllm.format.configs import size
from keras_vllm.format.names import VARIABLE_PATH_PATTERN
from keras_vllm.format.names import WEIGHTS_DIR

_VARIABLE_PATH = re.compile(VARIABLE_PATH_PATTERN)
_ARRAY_TYPES = ("np.ndarray", "jax.Array")
_HANDLER = (
    "orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
    "PyTreeCheckpointHandler"
)
# How far the config's implied parameter count may exceed the stored one
# (`configs.estimate_parameters` is rough: up to 2.4x on KerasHub's MoE
# families), and an allowance for tiny models.
_ESTIMATE_FACTOR = 8
_ESTIMATE_SLACK = 1 << 20
_EMBEDDING_SUFFIX = "token_embedding/embeddings"


def check_variable_index(manifest):
    """Paths and positions of `weights.variables`.

    Raises:
        ArtifactError: for a path that is not a Keras variable path, two
            entries claiming one position, or (full exports) a position
            no entry claims.
    """
    weights = manifest["weights"]
    variables = weights["variables"]
    total = weights.get("total_variables")
    claimed = {}
    for path, spec in variables.items():
        if _VARIABLE_PATH.fullmatch(path) is None:
            fail(
                f"Invalid manifest: 'weights.variables' lists "
                f"{path[:200]!r}, not a Keras variable path (names of "
                "letters, digits and '_' joined by '/'). The manifest was "
                "altered; re-export the model."
            )
        index = spec["index"]
        if index in claimed:
            fail(
                f"Invalid manifest: 'weights.variables' entries "
                f"'{claimed[index][:200]}' and '{path[:200]}' both claim "
                f"position {index}. The manifest was altered; re-export the "
                "model."
            )
        claimed[index] = path
        if total is not None and index >= total:
            fail(
                f"Invalid manifest: 'weights.variables['{path[:200]}'].index' "
                f"is {index}, but the backbone has {total} variables "
                "('weights.total_variables'). Re-export the model."
            )
    if weights["mode"] == "full" and sorted(claimed) != list(range(len(claimed))):
        missing = next(i for i in range(len(claimed) + 1) if i not in claimed)
        fail(
            f"Invalid manifest: a full export stores every variable, but no "
            f"entry of 'weights.variables' claims position {missing}. The "
            "manifest was altered; re-export the model."
        )


def check_orbax_tree(read, manifest):
    """The orbax tree metadata lists exactly the manifest's variables, as
    arrays in keras-vllm's layout, so orbax is asked for nothing else."""
    if manifest["weights"]["mode"] == "preset":
        return
    rel = WEIGHTS_DIR + "/_METADATA"
    metadata = read(rel)
    tree = metadata.get("tree_metadata") if isinstance(metadata, dict) else None
    if not isinstance(tree, dict):
        fail(f"{rel} has no 'tree_metadata'; the weights are damaged.")
    if metadata.get("use_ocdbt") is not True or metadata.get(
        "use_zarr3", False
    ) not in (True, False):
        fail(
            f"{rel}: 'use_ocdbt' must be true (keras-vllm writes one OCDBT "
            "database); the checkpoint was altered. Re-export the model."
        )
    stored = set()
    for entry in tree.values():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        if not isinstance(keys, list) or not all(
            isinstance(k, dict) and isinstance(k.get("key"), str) for k in keys
        ):
            fail(f"{rel} is malformed; the weights are damaged.")
        path = "/".join(k["key"] for k in keys)
        value = entry.get("value_metadata")
        if not (
            isinstance(value, dict)
            and value.get("value_type") in _ARRAY_TYPES
            and value.get("skip_deserialize", False) is False
        ):
            fail(
                f"{rel}: '{path[:200]}' is not stored as an array "
                f"(value_metadata {str(value)[:100]}). The checkpoint was "
                "altered; re-export the model."
            )
        if path in stored:
            fail(f"{rel} lists '{path[:200]}' twice; the weights are damaged.")
        stored.add(path)
    listed = adapter.stored_paths(manifest)
    if stored != listed:
        diff = sorted(stored ^ listed)
        fail(
            f"The weights checkpoint and the manifest list different "
            f"variables (e.g. '{diff[0][:200]}'). The artifact was altered; "
            "re-export it."
        )
    rel = WEIGHTS_DIR + "/_CHECKPOINT_METADATA"
    if rel in manifest["files"]:
        meta = read(rel)
        handlers = meta.get("item_handlers") if isinstance(meta, dict) else 0
        if handlers not in (None, _HANDLER):
            fail(
                f"{rel} names the handler {str(handlers)[:200]!r}; keras-vllm "
                "checkpoints are read by orbax's PyTreeCheckpointHandler "
                "only. The checkpoint was altered; re-export the model."
            )


def check_config_against_weights(manifest, estimate):
    """The backbone config against the stored variables, before building.

    Args:
        manifest: the validated manifest.
        estimate: the parameter count the backbone config implies
            (`configs.estimate_parameters`).
    """
    weights = manifest["weights"]
    config = manifest["backbone"]["config"]
    packing = quantization.packing(manifest)

    def values_per_element(path):
        return packing.get(path.rsplit("/", 1)[0], 1)

    for path, spec in weights["variables"].items():
        if path == _EMBEDDING_SUFFIX or path.endswith("/" + _EMBEDDING_SUFFIX):
            shape = spec["shape"]
            want = [size(config, "vocabulary_size"), size(config, "hidden_dim")]
            packed = values_per_element(path)
            if len(shape) != 2 or any(
                w is not None and s not in (w, -(-w // packed))
                for w, s in zip(want, shape)
            ):
                fail(
                    f"The backbone config (vocabulary_size "
                    f"{want[0]}, hidden_dim {want[1]}) does not match the "
                    f"stored token embedding '{path}' of shape {shape}. The "
                    "manifest was altered; re-export the model."
                )
    if weights["mode"] != "full":
        return
    stored = sum(
        math.prod(s["shape"]) * values_per_element(path)
        for path, s in weights["variables"].items()
    )
    if estimate > _ESTIMATE_FACTOR * stored + _ESTIMATE_SLACK:
        fail(
            f"The backbone config implies about {estimate:.3g} parameters, "
            f"but the artifact stores {stored} weight values. The config "
            "was altered to build a larger model than its weights; "
            "re-export the model."
        )


def check_preset_size(config_estimate, weight_bytes, handle):
    """A delta artifact's config against its preset's weight files' size."""
    if config_estimate > 4 * weight_bytes + _ESTIMATE_SLACK:
        fail(
            f"The backbone config implies about {config_estimate:.3g} "
            f"parameters, but the preset '{handle}' holds only "
            f"{weight_bytes} bytes of weights. The manifest was altered; "
            "re-export the model."
        )
