"""Weights stored with orbax-checkpoint, keyed by Keras `Variable.path`.

The paths (`transformer_layer_0/self_attention/query/kernel`) are nested by
`/` in the orbax tree. `keras_vllm.hub.weights` says which variables a
backbone has and what they hold.
"""

import errno

import numpy as np

from keras_vllm.errors import ArtifactError


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
    # This process's own CPU device: under JAX's distributed runtime (a
    # multi-host engine) `jax.devices()` starts with process 0's.
    sharding = jax.sharding.SingleDeviceSharding(
        jax.local_devices(backend="cpu")[0])
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
