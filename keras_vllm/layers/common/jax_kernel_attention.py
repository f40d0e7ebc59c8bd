"""keras-vllm's pure-JAX paged kernel, laid out as tpu-inference's attention.

The paths tpu-inference's RPA kernels cannot serve (an ALiBi bias,
`alibi_attention`; image placeholders that see past themselves,
`span_attention`) run `keras_vllm.kernels.ragged_paged_attention` instead,
on CPU and TPU alike. Everything around the kernel is what tpu-inference's
`attention()` does, and lives here once: the head-dim padding, the KV heads
repeated up to the mesh's head-axis size, and one `jax.shard_map` over the
mesh's data and attention-head axes. Nothing here names a model family.
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from keras_vllm import kernels


def sharded_kernel_attention(
    kv_cache,
    query,
    key,
    value,
    attention_metadata,
    *,
    mesh,
    per_call,
    **kernel_kwargs,
):
    """Writes this step's K/V into a layer's paged cache and attends over it
    with the pure-JAX kernel, sharded as tpu-inference shards attention.

    Arguments and results as `keras_vllm.layers.common.paged_attention.
    paged_attention`, plus:

    Args:
        mesh: the mesh to shard over, or None (`paged_attention`'s rule).
        per_call: `(name, array, axis)`: one more kernel keyword argument
            whose array is split over the mesh axis `axis` (a
            `ShardingAxisName`: per head for ALiBi slopes, per token for
            image spans).
        **kernel_kwargs: the kernel's other keyword arguments (`sm_scale`,
            `sliding_window`, ...), the same on every shard.

    Example:

    ```python
    new_cache, out = sharded_kernel_attention(
        kv_cache, q, k, v, metadata, mesh=None, sm_scale=0.125,
        per_call=("alibi_slopes", slopes, ShardingAxisName.ATTN_HEAD))
    ```
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
    name, array, axis = per_call

    def kernel(q, k, v, cache, kv_lens, page_indices, cu_q_lens,
               distribution, shard):
        # One shard: its part of the per-call array arrives split like the
        # queries (by head) or the tokens (by data).
        return kernels.ragged_paged_attention(
            q, k, v, cache, kv_lens, page_indices, cu_q_lens, distribution,
            hd64=padded_dim == 64, **{name: shard}, **kernel_kwargs)

    out, new_cache = jax.shard_map(
        kernel,
        mesh=mesh,
        in_specs=(qkv_spec, qkv_spec, qkv_spec, cache_spec, data_spec,
                  data_spec, data_spec, data_spec, P(axis)),
        out_specs=(qkv_spec, cache_spec),
        check_vma=False,
    )(query, key, value, kv_cache, md.seq_lens, md.block_tables,
      md.query_start_loc, md.request_distribution, array)
    return new_cache, out[..., :head_dim]


__all__ = ["sharded_kernel_attention"]
