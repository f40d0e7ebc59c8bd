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
    return [
        (kv_heads, head_dim) if kind == "sliding_attention"
        else (global_kv, global_dim)
        for kind in types[:owned]
    ]


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
