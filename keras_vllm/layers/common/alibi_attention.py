"""Paged attention with an ALiBi bias, for the ALiBi families' layers.

ALiBi models (Press et al., 2021) add a per-head linear bias to the
attention logits instead of rotating queries and keys. tpu-inference 0.32's
RPA kernels have no additive bias, so `paged_attention()` cannot serve
them. This module is the paged path for those families. It shares
everything with the default path except the kernel:

* the same KV cache, as tpu-inference allocates it from the layer's
  `KVCacheSpec` (default RPA v3 layout, or the head_dim == 64 layout);
* the same head-dim padding, metadata (`seq_lens`, `block_tables`,
  `query_start_loc`, `request_distribution`) and `jax.shard_map` over the
  mesh's attention-head axis as tpu-inference's `attention()`
  (`jax_kernel_attention`, shared with `span_attention`);
* the kernel is the pure-JAX `keras_vllm.kernels.ragged_paged_attention`
  (the one the CPU backend runs for every family) with `alibi_slopes`, so
  logits are

      sm_scale * (q . k) + slope[h] * (k_pos - q_pos)

  for keys `k_pos <= q_pos` of the query's own sequence. Families whose
  bias is added *before* the softmax scale pass `slope * sm_scale` as their
  slopes.

Slopes come from the caller (`alibi_slopes()` computes the standard
geometric ones); nothing here names a model family.

Cost: the kernel is `lax` control flow with no Pallas, so the same code runs
on CPU and TPU, with work proportional to the live tokens; on TPU it is much
slower than the RPA Pallas kernel (expect attention to dominate step time
for long prefills and large batches).
"""

import math

import jax.numpy as jnp

from keras_vllm.layers.common.jax_kernel_attention import (
    sharded_kernel_attention,
)


def alibi_slopes(num_heads, max_bias=8.0):
    """The standard ALiBi head slopes (the original implementation's).

    For a power-of-two `num_heads` they are the geometric sequence starting
    at `2 ** (-max_bias / num_heads)` with that same ratio; otherwise the
    slopes of the next lower power of two, then every other slope of the
    next higher one.

    Returns:
        A list of `num_heads` Python floats.
    """

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - math.log2(max_bias))))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = alibi_slopes(2 * closest, max_bias)[0::2][: num_heads - closest]
    return power_of_2(closest) + extra


def paged_alibi_attention(
    kv_cache,
    query,
    key,
    value,
    attention_metadata,
    *,
    sm_scale,
    alibi_slopes,
    mesh=None,
):
    """Writes this step's K/V into a layer's paged cache and attends over it
    with an ALiBi bias (causal, no window, no soft cap).

    Arguments and results as `keras_vllm.layers.common.paged_attention.
    paged_attention`, plus `alibi_slopes`: one float per query head (logit
    units, added as `slope * (k_pos - q_pos)` after `sm_scale`).
    """
    from tpu_inference.layers.common.sharding import ShardingAxisName

    slopes = jnp.asarray(alibi_slopes, jnp.float32)
    if slopes.shape != (query.shape[1],):
        raise ValueError(
            f"Expected {query.shape[1]} ALiBi slopes (one per query head), "
            f"got {slopes.shape[0]}."
        )
    # Each shard gets its heads' slopes, split like the queries.
    return sharded_kernel_attention(
        kv_cache, query, key, value, attention_metadata, mesh=mesh,
        per_call=("alibi_slopes", slopes, ShardingAxisName.ATTN_HEAD),
        sm_scale=sm_scale,
    )


__all__ = [
    "alibi_slopes",
    "paged_alibi_attention",
]
