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
  mesh's attention-head axis as tpu-inference's `attention()`;
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

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from keras_vllm import kernels


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
    from tpu_inference.utils import get_mesh_shape_product
    from tpu_inference.utils import get_padded_head_dim

    from keras_vllm.layers.common.paged_attention import _resolve_mesh

    head_dim = query.shape[-1]
    padded_dim = get_padded_head_dim(head_dim)
    if padded_dim != head_dim:
        # Zero padding is exact (see `paged_attention`).
        pad = [(0, 0), (0, 0), (0, padded_dim - head_dim)]
        query = jnp.pad(query, pad)
        key = jnp.pad(key, pad)
        value = jnp.pad(value, pad)
    slopes = jnp.asarray(alibi_slopes, jnp.float32)
    if slopes.shape != (query.shape[1],):
        raise ValueError(
            f"Expected {query.shape[1]} ALiBi slopes (one per query head), "
            f"got {slopes.shape[0]}."
        )
    mesh = _resolve_mesh(mesh)

    # As tpu-inference's `sharded_ragged_paged_attention`: replicate KV
    # heads up to the head-axis size, then shard every head axis over it.
    tp_size = get_mesh_shape_product(mesh, ShardingAxisName.ATTN_HEAD)
    num_kv_heads = key.shape[1]
    if tp_size > 1 and num_kv_heads < tp_size:
        key = jnp.repeat(key, tp_size // num_kv_heads, axis=1)
        value = jnp.repeat(value, tp_size // num_kv_heads, axis=1)
    md = attention_metadata
    qkv_spec = P(ShardingAxisName.ATTN_DATA, ShardingAxisName.ATTN_HEAD, None)
    cache_spec = P(
        ShardingAxisName.ATTN_DATA, None, ShardingAxisName.ATTN_HEAD, None, None
    )
    data_spec = P(ShardingAxisName.ATTN_DATA)

    def kernel(q, k, v, cache, kv_lens, page_indices, cu_q_lens,
               distribution, slopes):
        # One shard: its heads' slopes arrive sharded like the queries.
        return kernels.ragged_paged_attention(
            q, k, v, cache, kv_lens, page_indices, cu_q_lens, distribution,
            sm_scale=sm_scale, alibi_slopes=slopes, hd64=padded_dim == 64)

    out, new_cache = jax.shard_map(
        kernel,
        mesh=mesh,
        in_specs=(qkv_spec, qkv_spec, qkv_spec, cache_spec, data_spec,
                  data_spec, data_spec, data_spec,
                  P(ShardingAxisName.ATTN_HEAD)),
        out_specs=(qkv_spec, cache_spec),
        check_vma=False,
    )(query, key, value, kv_cache, md.seq_lens, md.block_tables,
      md.query_start_loc, md.request_distribution, slopes)
    return new_cache, out[..., :head_dim]


__all__ = [
    "alibi_slopes",
    "paged_alibi_attention",
]
