"""The one paged-attention call every served model family goes through.

Each family's paged attention layer computes its own query/key/value
projections, positions, scale, window and soft cap, then calls
`paged_attention()`. That function hands the work to tpu-inference's own
attention interface (`tpu_inference.layers.common.attention_interface.
attention`, pinned 0.32.0), the path tpu-inference's built-in JAX models use:

* on TPU it runs the RPA v3 Pallas kernel (the head_dim == 64 variant for
  head_dim 64), sharded over the mesh's KV-head axis with `jax.shard_map`;
* on JAX CPU devices `keras_vllm.cpu.apply_patches()` has replaced that
  kernel with an adapter to `keras_vllm.kernels.ragged_paged_attention`, and
  the same call runs the pure-JAX implementation.

Nothing here depends on a model family.
"""

import jax
import jax.numpy as jnp
import numpy as np


def paged_attention(
    kv_cache,
    query,
    key,
    value,
    attention_metadata,
    *,
    sm_scale,
    sliding_window=None,
    soft_cap=None,
    sinks=None,
    update_kv_cache=True,
    mesh=None,
):
    """Writes this step's K/V into a layer's paged cache and attends over it.

    Args:
        kv_cache: the layer's KV cache as tpu-inference allocated it
            (`[num_pages, page_size, rows // packing, packing, width]`; see
            `keras_vllm.kernels.kv_cache` for the layouts).
        query: `[T, Hq, D]` queries (positions already applied), with the
            model's real, unpadded head dim `D`.
        key: `[T, Hkv, D]` keys (positions already applied).
        value: `[T, Hkv, D]` values.
        attention_metadata: tpu-inference's `AttentionMetadata` for the step
            (`seq_lens`, `block_tables`, `query_start_loc`,
            `request_distribution`, `use_causal_mask`).
        sm_scale: softmax scale applied to `q @ k`. Always explicit: families
            differ (`D ** -0.5`, `query_pre_attn_scalar ** -0.5`, ...), and
            tpu-inference would otherwise derive it from the head dim.
        sliding_window: if set, a query at position `q` sees keys at `k` with
            `q - k < sliding_window` (the TPU kernel's convention).
        soft_cap: if set, logits become `soft_cap * tanh(logits / soft_cap)`.
        sinks: if set, `[Hq]` attention-sink logits: each head's softmax
            gets one more column with that logit and a zero value. Only
            tpu-inference's head_dim 64 kernel takes sinks (it refuses them
            for other head dims, and so does this call, by name).
        update_kv_cache: if False, `key`/`value` are not written: the layer
            reads a cache another layer wrote this step (KV sharing), and
            `new_kv_cache` is `kv_cache` unchanged.
        mesh: the `jax.sharding.Mesh` the model was built with. If None, the
            mesh of the enclosing `jax.set_mesh(...)` context is used (the
            tpu-inference runner sets it around every step), and outside any
            mesh context a one-device mesh over the first JAX device.

    Returns:
        `(new_kv_cache, out)` with `out` `[T, Hq, D]` (unpadded head dim).
        Rows of padding tokens are unspecified.
    """
    from tpu_inference.layers.common import attention_interface
    from tpu_inference.utils import get_padded_head_dim

    head_dim = query.shape[-1]
    # tpu-inference's caches and kernels are laid out for a padded head dim:
    # 64 stays 64 (its hd64 kernel), anything else rounds up to a multiple of
    # 128. Zero padding is exact: it adds 0 to every q.k and yields zero
    # output columns, which are cut off again below.
    padded_dim = get_padded_head_dim(head_dim)
    if sinks is not None:
        if padded_dim != 64:
            raise NotImplementedError(
                f"Attention sinks need head_dim 64 (tpu-inference's hd64 "
                f"kernel is the only one that takes them); got {head_dim}."
            )
        # The kernels read sinks as float32, one per query head.
        sinks = jnp.asarray(sinks, jnp.float32).reshape(-1)
    if padded_dim != head_dim:
        pad = [(0, 0), (0, 0), (0, padded_dim - head_dim)]
        query = jnp.pad(query, pad)
        key = jnp.pad(key, pad)
        value = jnp.pad(value, pad)

    new_kv_cache, out = attention_interface.attention(
        kv_cache,
        query,
        key,
        value,
        attention_metadata,
        _resolve_mesh(mesh),
        head_dim_original=head_dim,
        sm_scale=sm_scale,
        # tpu-inference 0.32 names the kernel's sliding window
        # "attention_chunk_size" at this level (Gemma 4 passes its
        # sliding_window here); the kernel masks q - k >= window.
        attention_chunk_size=sliding_window,
        attn_logits_soft_cap=soft_cap,
        sinks=sinks,
        update_kv_cache=update_kv_cache,
    )
    return new_kv_cache, out[..., :head_dim]


def _resolve_mesh(mesh):
    """The mesh to shard attention over (see `paged_attention`'s `mesh`)."""
    if mesh is not None:
        return mesh
    context_mesh = jax.sharding.get_abstract_mesh()
    if not context_mesh.empty:
        return context_mesh
    return _single_device_mesh()


def _single_device_mesh():
    """A one-device mesh carrying every axis name attention shards over."""
    from tpu_inference.layers.common.sharding import ShardingAxisName

    names = []
    for axes in (ShardingAxisName.ATTN_DATA, ShardingAxisName.ATTN_HEAD):
        for name in (axes, ) if isinstance(axes, str) else axes:
            if name not in names:
                names.append(name)
    devices = np.array(jax.local_devices()[:1]).reshape((1, ) * len(names))
    return jax.sharding.Mesh(devices, tuple(names))
