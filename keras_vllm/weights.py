"""Weights keyed by Keras `Variable.path`, stored with orbax-checkpoint.

Keras paths (`transformer_layer_0/self_attention/query/kernel`) are stable
across processes and NNX on/off, unlike NNX state paths, so they are the
interchange key. In the orbax tree they are nested by `/`.
"""

import errno
import re

import numpy as np

from keras_vllm.errors import ArtifactError


def _lora_merged_kernels(backbone):
    """Maps `id(kernel variable)` to its LoRA-merged value, for LoRA layers."""
    merged = {}
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        if getattr(layer, "lora_enabled", False):
            # The `kernel` property returns `kernel + alpha/rank * A @ B`.
            merged[id(layer._kernel)] = layer.kernel
    return merged


def _is_lora_factor(variable):
    return variable.path.rsplit("/", 1)[-1] in ("lora_kernel_a", "lora_kernel_b")


def ordered_variables(backbone):
    """The backbone's variables in their (deterministic) order, LoRA factors
    excluded. A variable's position here is its `index` in the manifest."""
    return [v for v in backbone.weights if not _is_lora_factor(v)]


def canonical_path(path):
    """A variable path without Keras' per-process auto-numbering.

    Layers that KerasHub does not name explicitly get names such as
    `mixtral_sparse_moe_block_3`, numbered by how many were built before in
    the process, so the same variable can have another path in another
    process. Stripping trailing `_<n>` from every component gives a name to
    check a match by position against.
    """
    return "/".join(re.sub(r"(_\d+)+$", "", part) for part in path.split("/"))


def match_variable(variables, path, index):
    """The variable at `index` of `ordered_variables`, checked against `path`.

    Raises:
        ArtifactError: if the position is out of range or holds another
            variable.
    """
    if not isinstance(index, int) or not 0 <= index < len(variables):
        raise ArtifactError(
            f"Variable '{path}' has index {index!r}, outside the backbone's "
            f"{len(variables)} variables."
        )
    variable = variables[index]
    if canonical_path(variable.path) != canonical_path(path):
        raise ArtifactError(
            f"The artifact stores variable '{path}' at position {index}, "
            f"where the rebuilt backbone has '{variable.path}'."
        )
    return variable


def backbone_weights(backbone):
    """Returns `{variable.path: numpy array}` with LoRA adapters merged, in
    `ordered_variables` order.

    LoRA factors are folded into their kernels (as keras-hub's own
    `save_to_preset` does) so the result loads into the plain backbone.
    """
    merged = _lora_merged_kernels(backbone)
    weights = {}
    for variable in ordered_variables(backbone):
        value = merged.get(id(variable), variable.value)
        if variable.path in weights:
            raise ArtifactError(f"Duplicate variable path '{variable.path}'.")
        weights[variable.path] = np.asarray(value)
    return weights


def _nest(flat):
    tree = {}
    for path, value in flat.items():
        node = tree
        parts = path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def _flatten(tree, prefix=""):
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else key
        if isinstance(value, dict):
            flat.update(_flatten(value, path))
        else:
            flat[path] = value
    return flat


def save_weights(directory, weights):
    """Writes `{path: array}` as an orbax checkpoint at `directory`."""
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    try:
        checkpointer.save(directory, _nest(weights))
    except OSError:
        raise
    except Exception as e:  # orbax/tensorstore wrap I/O errors
        text = str(e)
        if any(s in text for s in ("No space left", "ENOSPC", "errno=28")):
            raise OSError(
                errno.ENOSPC, f"No space left on device ({text[:200]})", directory
            ) from e
        raise


def restore_weights(directory, specs):
    """Reads the weights listed in `specs` from an orbax checkpoint.

    Args:
        directory: the checkpoint directory.
        specs: `{path: (shape, dtype)}` validated against the backbone.

    Returns:
        `{path: numpy array}`.
    """
    import jax
    import orbax.checkpoint as ocp

    sharding = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    target = {
        path: jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)
        for path, (shape, dtype) in specs.items()
    }
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        restored = checkpointer.restore(
            directory,
            item=_nest(target),
            restore_args=_nest(
                {
                    p: ocp.ArrayRestoreArgs(sharding=sharding, dtype=t.dtype)
                    for p, t in target.items()
                }
            ),
        )
    except Exception as e:  # orbax/tensorstore raise many types
        raise ArtifactError(
            f"The weights checkpoint could not be read ({type(e).__name__}: "
            f"{str(e)[:300]}). The artifact is damaged; re-export it."
        ) from None
    flat = _flatten(restored)
    result = {}
    for path, (shape, dtype) in specs.items():
        if path not in flat:
            raise ArtifactError(f"Weights checkpoint lacks variable '{path}'.")
        array = np.asarray(flat[path])
        if tuple(array.shape) != tuple(shape):
            raise ArtifactError(
                f"Variable '{path}' has shape {array.shape} in the "
                f"checkpoint, the manifest records {tuple(shape)}."
            )
        result[path] = array
    return result
