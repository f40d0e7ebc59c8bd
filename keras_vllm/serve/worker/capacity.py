"""What an artifact needs per device at each tensor-parallel size.

`keras-vllm inspect` prints this so a serving team can choose a TP size
before renting chips. The backbone is built abstractly (`nnx.eval_shape`:
shapes and dtypes only, no memory, no weights read), and each variable is
split exactly as serving places it (`keras_vllm.serve.worker.sharding`).
"""

import numpy as np

from keras_vllm.hub import checkpoint
from keras_vllm.load import keras_loader
from keras_vllm.load import quantized
from keras_vllm.load import rebuild
from keras_vllm.serve.worker import sharding
from keras_vllm.load import tensor_parallel

TP_SIZES = (1, 2, 4, 8)


def abstract_backbone(manifest):
    """The artifact's backbone with shapes only (allowlisted class)."""
    from flax import nnx

    cls = keras_loader.resolve_classes(manifest)["backbone"]
    dtype = manifest["dtype"]
    config = dict(
        manifest["backbone"]["config"],
        dtype=quantized.policy_map(manifest, dtype) or dtype,
    )
    return nnx.eval_shape(lambda: rebuild.construct(cls, config, "backbone"))


def _itemsize(dtype):
    return np.dtype(checkpoint.dtype_of(str(dtype))).itemsize


def padded_head_dim(head_dim):
    """The head dim tpu-inference 0.32 lays its KV cache out for
    (`utils.get_padded_head_dim`: 64 stays, others round up to 128)."""
    return head_dim if head_dim == 64 else -(-head_dim // 128) * 128


def cache_shapes(config):
    """`(num_kv_heads, head_dim)` of each KV cache vLLM allocates for the
    artifact's `config.json`, as tpu-inference's runner reads it: per kind
    of layer (`layer_types`), with the last `num_kv_shared_layers` layers
    allocating none (they read an earlier layer's cache)."""
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config["head_dim"])
    types = config.get("layer_types") or ["full_attention"] * layers
    global_kv = (
        int(config["num_global_key_value_heads"])
        if config.get("attention_k_eq_v") else kv_heads
    )
    global_dim = int(config.get("global_head_dim") or head_dim)
    owned = layers - int(config.get("num_kv_shared_layers") or 0)
    state = set(config.get("recurrent_state_layers") or ())
    return [
        (kv_heads, head_dim) if kind == "sliding_attention"
        else (global_kv, global_dim)
        for index, kind in enumerate(types[:owned])
        if index not in state
    ]


def state_bytes_per_sequence(config):
    """Bytes of recurrent state one sequence keeps, over all the layers
    with a recurrent state (format 1.10; 0 without): vLLM holds one such
    slot per sequence the engine runs at once (`max_num_seqs`), plus one.
    A speculating engine holds `num_speculative_tokens + 1` slots a
    sequence, a state per draft position
    (`gated_delta_rule.conv1d_gdn_windowed`).

    Example:

    >>> state_bytes_per_sequence(json.load(open("config.json")))
    """
    layers = len(config.get("recurrent_state_layers") or ())
    per_layer = sum(
        int(np.prod(shape)) * _itemsize(dtype)
        for shape, dtype in zip(
            config.get("recurrent_state_shapes") or (),
            config.get("recurrent_state_dtypes") or (),
        )
    )
    return layers * per_layer


def _kinds(config):
    """Each layer's kind (`layer_types`, full attention when absent)."""
    layers = int(config["num_hidden_layers"])
    return list(config.get("layer_types") or ["full_attention"] * layers)


def kv_by_kind(config, dtype):
    """KV cache bytes per token on one device, per kind of layer.

    A layer that reads another layer's cache (`num_kv_shared_layers`)
    allocates none: it counts as a layer of its kind but adds no cache and
    no bytes, so the totals are what vLLM allocates.

    Args:
        config: the artifact's `config.json`.
        dtype: the stored dtype name (the cache's).

    Returns:
        One dict per kind, in the order the kinds first appear: `kind`,
        `layers` (how many), `caches` (how many allocate one), `kv_heads`,
        `head_dim` (the model's), `laid_out` (the cache's head size,
        `padded_head_dim`), `bytes` (per token, keys and values of its
        caches) and `unshared_bytes` (what its layers would take if each
        had its own cache).

    Example:

    >>> rows = kv_by_kind(json.load(open("config.json")), "float32")
    >>> sum(row["bytes"] for row in rows)  # the TP=1 row of per_device
    """
    itemsize = _itemsize(dtype)
    kinds = _kinds(config)
    # The layers that allocate their own cache (the last
    # `num_kv_shared_layers` read an earlier one's).
    owned = len(kinds) - int(config.get("num_kv_shared_layers") or 0)
    state = set(config.get("recurrent_state_layers") or ())
    rows = {}
    for index, kind in enumerate(kinds):
        if index in state:
            continue
        if kind not in rows:
            kv_heads, head_dim = _shape_of_kind(config, kind)
            per_cache = 2 * kv_heads * padded_head_dim(head_dim) * itemsize
            rows[kind] = {
                "kind": kind, "layers": 0, "caches": 0,
                "kv_heads": kv_heads, "head_dim": head_dim,
                "laid_out": padded_head_dim(head_dim), "bytes": 0,
                "unshared_bytes": 0, "_per_cache": per_cache,
            }
        row = rows[kind]
        row["layers"] += 1
        row["unshared_bytes"] += row["_per_cache"]
        if index < owned:
            row["caches"] += 1
            row["bytes"] += row["_per_cache"]
    for row in rows.values():
        del row["_per_cache"]
    return list(rows.values())


def _shape_of_kind(config, kind):
    """`(num_kv_heads, head_dim)` of a layer kind's caches."""
    only = dict(config, layer_types=[kind], num_hidden_layers=1,
                num_kv_shared_layers=0, recurrent_state_layers=[])
    return cache_shapes(only)[0]


def per_device(backbone, config, dtype, sizes=TP_SIZES):
    """Rows `(tp, weight_bytes, kv_bytes_per_token)` per device, with
    `None` bytes for sizes serving refuses (`tensor_parallel.refusal`).

    Args:
        backbone: a built (or abstract) backbone.
        config: the artifact's `config.json`.
        dtype: the stored dtype name.
        sizes: the TP sizes to report.
    """
    itemsize = _itemsize(dtype)
    shapes = cache_shapes(config)
    variables = [v for _, v in sharding.owned_variables(backbone)]
    rows = []
    for size in sizes:
        if tensor_parallel.refusal(config, size) is not None:
            rows.append((size, None, None))
            continue
        axes = sharding.variable_axes(
            backbone, {role: size for role in sharding.ROLES}
        )
        weight_bytes = 0
        for variable in variables:
            count = int(np.prod(variable.shape))
            split = size if axes[variable.path] is not None else 1
            # Each variable in its own dtype: quantized kernels are int8.
            weight_bytes += count * _itemsize(variable.dtype) // split
        # KV heads are padded up to the TP size when fewer (repeated).
        kv_bytes = sum(
            2 * (max(kv_heads, size) // size) * padded_head_dim(head_dim)
            * itemsize
            for kv_heads, head_dim in shapes
        )
        rows.append((size, weight_bytes, kv_bytes))
    return rows
