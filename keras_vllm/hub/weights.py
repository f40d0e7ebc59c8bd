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


# Keras' LoRA factors, and the adapter slots a multi-adapter engine adds
# to its served projections (`keras_vllm.layers.common.lora_slots`): neither is a
# model variable of the artifact.
_LORA_VARIABLES = (
    "lora_kernel_a", "lora_kernel_b",
    "lora_slots_a", "lora_slots_b", "lora_slots_scale", "lora_slots_bias",
)


def _is_lora_factor(variable):
    return variable.path.rsplit("/", 1)[-1] in _LORA_VARIABLES


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
    compare a model with its preset by (the export side; loading checks
    paths more strictly, with `VariableMatcher`).
    """
    return "/".join(re.sub(r"(_\d+)+$", "", part) for part in path.split("/"))


class PathIndex:
    """Finds a counterpart by path in another backbone's `{path: value}`.

    The exact path first (explicitly named layers, e.g.
    `transformer_layer_0/...`, have the same path in every process), else
    the single entry with the same `canonical_path` (an auto-numbered
    layer); None when there is no single match.
    """

    def __init__(self, items):
        self._exact = dict(items)
        self._canonical = {}
        for path, value in self._exact.items():
            self._canonical.setdefault(canonical_path(path), []).append(value)

    def get(self, path):
        if path in self._exact:
            return self._exact[path]
        found = self._canonical.get(canonical_path(path), [])
        return found[0] if len(found) == 1 else None


def auto_named_layers(backbone):
    """Names of the backbone's layers that Keras numbered itself.

    A layer built without a name is called after its class in snake case,
    numbered by how many such layers the process built before
    (`einsum_dense`, `einsum_dense_3`); KerasHub's own names
    (`transformer_layer_0`, `ffw_gating_2`) are not of that form.
    """
    from keras.src.utils.naming import to_snake_case

    names = set()
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        base = re.escape(to_snake_case(type(layer).__name__))
        if re.fullmatch(base + r"(_\d+)?", layer.name):
            names.add(layer.name)
    return names


def _auto_base(name):
    return re.sub(r"_\d+$", "", name)


class VariableMatcher:
    """Matches manifest entries to the rebuilt backbone's variables.

    By position (`index` into `ordered_variables`), checked against the
    recorded path: components must be equal, except the name of a layer
    Keras numbered itself, which may carry another number, but one number
    per layer: within one parent, an artifact's name maps to exactly one
    rebuilt layer and back.

    Example:

    ```python
    matcher = VariableMatcher(backbone, ordered_variables(backbone))
    variable = matcher.match("transformer_layer_0/.../kernel", 3)
    ```
    """

    def __init__(self, backbone, ordered):
        self.ordered = ordered
        self.auto = auto_named_layers(backbone)
        self._to_target = {}
        self._to_artifact = {}

    def match(self, path, index):
        """The variable at `index`, checked against `path`.

        Raises:
            ArtifactError: if the position is out of range or holds another
                variable.
        """
        variables = self.ordered
        if not isinstance(index, int) or not 0 <= index < len(variables):
            raise ArtifactError(
                f"Variable '{path}' has index {index!r}, outside the "
                f"backbone's {len(variables)} variables."
            )
        variable = variables[index]
        recorded = path.split("/")
        actual = variable.path.split("/")
        mismatch = len(recorded) != len(actual)
        for i, (a, t) in enumerate(zip(recorded, actual)):
            if mismatch:
                break
            if t in self.auto:
                parent = "/".join(actual[:i])
                if _auto_base(a) != _auto_base(t):
                    mismatch = True
                elif self._to_target.setdefault((parent, a), t) != t or (
                    self._to_artifact.setdefault((parent, t), a) != a
                ):
                    raise ArtifactError(
                        f"The artifact numbers the layer '{parent}/{t}' "
                        "inconsistently (two recorded names for one layer, "
                        f"or one name for two, e.g. '{path}' at position "
                        f"{index}). The manifest was altered; re-export the "
                        "model."
                    )
            elif a != t:
                mismatch = True
        if mismatch:
            raise ArtifactError(
                f"The artifact stores variable '{path}' at position {index}, "
                f"where the rebuilt backbone has '{variable.path}'."
            )
        return variable


def quantized_layers(backbone):
    """`{layer path: layer}` of the backbone's Keras-quantized layers."""
    return {
        layer.path: layer
        for layer in backbone._flatten_layers(include_self=False, recursive=True)
        if getattr(layer, "quantization_mode", None) is not None
    }


def backbone_values(backbone):
    """`(variable, value)` in `ordered_variables` order, LoRA merged.

    The values are the backend's arrays, where they lie (no host copy): a
    running engine takes a live model's weights from here.
    """
    merged = _lora_merged_kernels(backbone)
    return [
        (variable, merged.get(id(variable), variable.value))
        for variable in ordered_variables(backbone)
    ]


def backbone_weights(backbone):
    """Returns `{variable.path: numpy array}` with LoRA adapters merged, in
    `ordered_variables` order.

    LoRA factors are folded into their kernels (as keras-hub's own
    `save_to_preset` does) so the result loads into the plain backbone.
    """
    weights = {}
    for variable, value in backbone_values(backbone):
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


def _save_checkpointer():
    """An orbax checkpointer that writes the caller's arrays as they are.

    orbax's defaults deep-copy every host array before writing (a guard
    against changes while a save runs in the background; this save is
    synchronous, so nothing changes the arrays, host views of the model's
    own buffers, until it returns) and compress the chunks with zstd. On a
    125M-parameter float32 model the two took the export's writing from
    1.1 s to 5.9 s and its extra memory from 7 MB to 870 MB (1.75x the
    weights), for ~8% of size on random float weights (475 MB compressed,
    515 MB not, on the 128M benchmark model). Readers need no option either
    way.
    """
    import jax
    import orbax.checkpoint as ocp

    handlers = ocp.type_handlers
    registry = handlers.create_type_handler_registry(
        (np.ndarray, handlers.NumpyHandler(deepcopy_host_arrays=False)),
        (np.number, handlers.ScalarHandler()),
        (jax.Array, handlers.get_type_handler(jax.Array)),
    )
    return ocp.Checkpointer(
        ocp.PyTreeCheckpointHandler(
            type_handler_registry=registry, use_compression=False
        )
    )


# OCDBT data files of at most this size are written in parallel; orbax's
# default (2 GiB) makes one file, written sequentially (the 128M benchmark
# model: 1.4 s instead of 2.8-6.6 s, docs/benchmarks.md). Same layout.
_DATA_FILE_BYTES = 64 << 20


def save_weights(directory, weights):
    """Writes `{path: array}` as an orbax checkpoint at `directory`."""
    import orbax.checkpoint as ocp

    checkpointer = _save_checkpointer()
    try:
        checkpointer.save(
            directory,
            args=ocp.args.PyTreeSave(
                _nest(weights), ocdbt_target_data_file_size=_DATA_FILE_BYTES
            ),
        )
    except OSError:
        raise
    except Exception as e:  # orbax/tensorstore wrap I/O errors
        text = str(e)
        if any(s in text for s in ("No space left", "ENOSPC", "errno=28")):
            raise OSError(
                errno.ENOSPC, f"No space left on device ({text[:200]})", directory
            ) from e
        raise
    finally:
        # orbax writes from background threads; after a failed write they
        # may still be creating files, and the caller's cleanup of the
        # staging directory would race them (CI saw one survive).
        try:
            checkpointer.close()
        except Exception:
            pass


def stored_arrays(directory):
    """`{path: (shape, dtype name)}` from orbax's own checkpoint metadata
    (the array metadata it wrote beside the data), read without restoring
    any array."""
    import jax
    import orbax.checkpoint as ocp

    try:
        metadata = ocp.PyTreeCheckpointer().metadata(directory)
        tree = getattr(metadata, "item_metadata", metadata)
        tree = getattr(tree, "tree", tree)
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {
            "/".join(str(getattr(k, "key", k)) for k in key): (
                tuple(leaf.shape),
                str(np.dtype(leaf.dtype)),
            )
            for key, leaf in leaves
        }
    except Exception as e:  # orbax/tensorstore raise many types
        raise ArtifactError(
            f"The weights checkpoint's metadata could not be read "
            f"({type(e).__name__}: {str(e)[:300]}). The artifact is damaged; "
            "re-export it."
        ) from None


def check_stored_arrays(directory, specs, without_jax=False):
    """Each recorded shape and dtype is the one orbax stored: a differing
    record is refused, never cast or reshaped into place."""
    if without_jax:
        from keras_vllm.hub.weight_headers import stored_arrays_without_jax

        stored = stored_arrays_without_jax(directory)
    else:
        stored = stored_arrays(directory)
    for path, (shape, dtype) in sorted(specs.items()):
        if path not in stored:
            raise ArtifactError(f"Weights checkpoint lacks variable '{path}'.")
        if stored[path] != (tuple(shape), str(np.dtype(dtype_of(dtype)))):
            raise ArtifactError(
                f"Variable '{path}' is recorded in the manifest as "
                f"{dtype}{list(shape)}, but the weights checkpoint stores "
                f"{stored[path][1]}{list(stored[path][0])}. The manifest or "
                "the checkpoint was altered; re-export the model."
            )


def dtype_of(name):
    """The numpy dtype of a manifest dtype name (bfloat16 via ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def restore_weights(directory, specs, as_numpy=True):
    """Reads the weights listed in `specs` from an orbax checkpoint.

    Args:
        directory: the checkpoint directory.
        specs: `{path: (shape, dtype)}` validated against the backbone.
        as_numpy: return numpy arrays (host views of the restored buffers)
            instead of the JAX arrays orbax restored on the CPU device. A
            model's variables should take the JAX arrays: a JAX array made
            from a host view aliases memory XLA does not own, so a jitted
            call that donates it (tpu-inference places a model so) copies
            it instead (every weight of the 128M benchmark model, ~5 s on
            the 2-core host, docs/benchmarks.md).

    Returns:
        `{path: array}`.
    """
    import jax
    import orbax.checkpoint as ocp

    check_stored_arrays(directory, specs)
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
        array = np.asarray(flat[path]) if as_numpy else flat[path]
        if tuple(array.shape) != tuple(shape):
            raise ArtifactError(
                f"Variable '{path}' has shape {array.shape} in the "
                f"checkpoint, the manifest records {tuple(shape)}."
            )
        result[path] = array
    return result
