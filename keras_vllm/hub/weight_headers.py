"""The shapes and dtypes of a weights checkpoint, without starting JAX.

orbax's own metadata call (`keras_vllm.hub.checkpoint.stored_arrays`) starts JAX's
backend; a process that must leave the accelerator to vLLM's engine (the
API server, an engine's parent, checking an adapter before it is served)
reads the arrays' zarr headers from the checkpoint's OCDBT store with
tensorstore alone.
"""

import json
import os

import numpy as np

from keras_vllm.errors import ArtifactError


def stored_arrays_without_jax(directory):
    """`{path: (shape, dtype name)}` of an orbax (OCDBT) checkpoint, from
    each array's zarr header; no array is read."""
    import tensorstore as ts

    try:
        # orbax names each array by its keys joined with '.'; its tree
        # metadata holds the keys themselves (a key may contain a '.').
        with open(os.path.join(directory, "_METADATA"), "rb") as f:
            tree = json.loads(f.read(64 << 20))["tree_metadata"]
        paths = {}
        for entry in tree.values():
            keys = [str(k["key"]) for k in entry["key_metadata"]]
            paths[".".join(keys)] = "/".join(keys)
        store = ts.KvStore.open({
            "driver": "ocdbt",
            "base": "file://" + os.path.abspath(directory) + "/",
        }).result()
        found = {}
        for name, path in paths.items():
            value = store.read(name + "/.zarray").result().value
            header = json.loads(bytes(value))
            dtype = header["dtype"]
            dtype = dtype if dtype == "bfloat16" else np.dtype(dtype).name
            found[path] = (tuple(header["shape"]), dtype)
        return found
    except Exception as e:  # tensorstore raises many types
        raise ArtifactError(
            f"The weights checkpoint's metadata could not be read "
            f"({type(e).__name__}: {str(e)[:300]}). The artifact is damaged; "
            "re-export it."
        ) from None
