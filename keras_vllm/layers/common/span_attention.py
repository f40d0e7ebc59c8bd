"""Paged attention where some tokens see past their own position.

A vision-language model's image placeholders attend to their whole image
(Gemma 3: both directions within one image's run of placeholders), text
tokens causally. tpu-inference 0.32's RPA kernels take one causal flag per
call and no per-token limit, so a step that carries image placeholders
attends through the pure-JAX `keras_vllm.kernels.ragged_paged_attention`
with `attend_until` (each token's last visible key position), on CPU and
TPU alike; steps without images keep the default path (`paged_attention`).
Everything else is as `paged_attention`: the same cache layouts, head-dim
padding, metadata and `jax.shard_map` over the mesh's attention-head axis.

The keys a placeholder sees must be written in the same step or before, so
an image's placeholders must not be split across prefill chunks (vLLM's
`disable_chunked_mm_input`, which keras-vllm sets for image artifacts).
Nothing here names a model family.
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from keras_vllm import kernels


def paged_span_attention(
    kv_cache,
    query,
    key,
    value,
    attention_metadata,
    *,
    sm_scale,
    attend_until,
    sliding_window=None,
    soft_cap=None,
    mesh=None,
):
    """Writes this step's K/V into a layer's paged cache and attends over it,
    each token up to its `attend_until` position.

    Arguments and results as `keras_vllm.layers.common.paged_attention.
    paged_attention`, plus `attend_until`: `int32[T]`, the last key position
    each token sees (its own position for causal tokens). With a sliding
    window, a token that sees past itself uses KerasHub's symmetric band
    `|q - k| < sliding_window`.
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

    def kernel(q, k, v, cache, kv_lens, page_indices, cu_q_lens,
               distribution, until):
        return kernels.ragged_paged_attention(
            q, k, v, cache, kv_lens, page_indices, cu_q_lens, distribution,
            sm_scale=sm_scale, sliding_window=sliding_window,
            soft_cap=soft_cap, attend_until=until, hd64=padded_dim == 64)

    out, new_cache = jax.shard_map(
        kernel,
        mesh=mesh,
        in_specs=(qkv_spec, qkv_spec, qkv_spec, cache_spec, data_spec,
                  data_spec, data_spec, data_spec, data_spec),
        out_specs=(qkv_spec, cache_spec),
        check_vma=False,
    )(query, key, value, kv_cache, md.seq_lens, md.block_tables,
      md.query_start_loc, md.request_distribution,
      attend_until.astype(jnp.int32))
    return new_cache, out[..., :head_dim]


__all__ = ["paged_span_attention"]
