"""The `[Q | K | V]` channel order a gated-delta-rule layer has per shard.

tpu-inference's `run_jax_gdn_attention` shard-maps its kernel over the
heads axis and hands each device a contiguous `1/N` of the mixed
projection's channels (and of the conv weight and conv state), expecting
that slice to be the device's own `[Q_i | K_i | V_i]`: its key heads'
queries, its key heads' keys, its value heads' values. A model's fused
projection is laid out `[Q | K | V]` over all heads, so the first half of
it is all of `Q` and part of `K`. vLLM's PyTorch path reorders the weights
(`reorder_concatenated_tensor_for_sharding`); keras-vllm instead reorders
the projection's output and the conv weight each step with one constant
permutation, so every weight path (LoRA, reloads, quantized kernels) keeps
the Keras layout. The conv state is only ever written and read in the
permuted order, so it needs no conversion.

The delta rule repeats each key head over `num_value_heads //
num_key_heads` consecutive value heads (`jnp.repeat`, as KerasHub does);
splitting both by contiguous heads keeps every value head with its key
head, provided both counts divide by the number of shards.

Nothing here names a model family.
"""

import numpy as np

from keras_vllm.errors import ServingError


def check_heads_split(num_key_heads, num_value_heads, shards):
    """Raises unless both head counts divide by `shards`.

    Raises:
        ServingError: naming the counts and the sizes that work.
    """
    if num_key_heads % shards == 0 and num_value_heads % shards == 0:
        return
    sizes = [
        s
        for s in range(1, num_value_heads + 1)
        if num_key_heads % s == 0 and num_value_heads % s == 0
    ]
    raise ServingError(
        f"tensor_parallel_size={shards} cannot split a linear-attention "
        f"layer with {num_key_heads} key heads and {num_value_heads} value "
        "heads: both must divide by the size. Sizes that work: "
        f"{', '.join(str(s) for s in sizes)}."
    )


def per_shard_order(
    num_key_heads, key_head_dim, num_value_heads, value_head_dim, shards
):
    """The channel permutation that makes `[Q | K | V]` per-shard contiguous.

    Args:
        num_key_heads, key_head_dim: the query/key heads and their size.
        num_value_heads, value_head_dim: the value heads and their size.
        shards: devices along the heads axis.

    Returns:
        An int array `order` of `2 * key_dim + value_dim` channels: channel
        `order[j]` of the model's `[Q | K | V]` goes to position `j`, so
        that shard `i` holds `[Q_i | K_i | V_i]`. The identity for one shard.

    Example:

    >>> per_shard_order(2, 1, 2, 2, shards=2).tolist()
    [0, 2, 4, 5, 1, 3, 6, 7]
    """
    key_dim = num_key_heads * key_head_dim
    value_dim = num_value_heads * value_head_dim
    key_part = key_dim // shards
    value_part = value_dim // shards
    order = []
    for i in range(shards):
        order += range(i * key_part, (i + 1) * key_part)  # Q_i
        order += range(key_dim + i * key_part, key_dim + (i + 1) * key_part)
        start = 2 * key_dim + i * value_part
        order += range(start, start + value_part)  # V_i
    return np.asarray(order, dtype=np.int32)
