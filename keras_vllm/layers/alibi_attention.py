"""Paged attention with an ALiBi bias, in pure JAX.

ALiBi models (Press et al., 2021) add a per-head linear bias to the
attention logits instead of rotating queries and keys. tpu-inference 0.32's
RPA kernels have no additive bias, so `paged_attention()` cannot serve
them. This module is the paged path for those families. It shares
everything with the default path except the attention loop itself:

* the same KV cache, as tpu-inference allocates it from the layer's
  `KVCacheSpec` (default RPA v3 layout, or the head_dim == 64 layout), and
  the same cache writes (`keras_vllm.cpu.ragged_paged_attention`'s
  `_merge_kv`: new K/V rows are scattered into their pages first);
* the same head-dim padding, metadata (`seq_lens`, `block_tables`,
  `query_start_loc`, `request_distribution`) and `jax.shard_map` over the
  mesh's attention-head axis as tpu-inference's `attention()`;
* a flash (online-softmax) loop like the CPU kernel's, with logits

      sm_scale * (q . k) + slope[h] * (k_pos - q_pos)

  for keys `k_pos <= q_pos` of the query's own sequence. Softmax ignores a
  per-row constant, so this equals every ALiBi convention that differs
  only by one (`slope * k_pos`, `slope * (k_pos - (kv_len - 1))`).
  Families whose bias is added *before* the softmax scale pass
  `slope * sm_scale` as their slopes.

Slopes come from the caller (`alibi_slopes()` computes the standard
geometric ones); nothing here names a model family.

Cost: it is jittable `lax` control flow with no Pallas kernel, so the same
code runs on CPU and TPU. Work is proportional to the live tokens: a
`fori_loop` over the `request_distribution[2]` live sequences, each in
blocks of 8 queries, each block visiting only the KV blocks (about 128
tokens, whole pages) at or before its last query, gathered from the page
table. Compute is O(sum over sequences of q_len * kv_len) like any causal
attention, memory O(block) per step, but the loops are sequential and
unfused: on TPU it is much slower than the RPA Pallas kernel (expect
attention to dominate step time for long prefills and large batches).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from keras_vllm.cpu import ragged_paged_attention as _rpa

_Q_BLOCK = _rpa._Q_BLOCK
_KV_BLOCK_TOKENS = _rpa._KV_BLOCK_TOKENS
_NEG = _rpa._NEG


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


def paged_attend_with_alibi(layer, query, key, value, *, sm_scale, slopes):
    """`PagedAttention.paged_attend` with an ALiBi bias, for family layers.

    Args:
        layer: the paged attention layer (its `kv_cache_index` and the
            active serving context are used).
        query: `[T, 1, num_heads, head_dim]`.
        key: `[T, 1, num_kv_heads, head_dim]`.
        value: `[T, 1, num_kv_heads, head_dim]`.
        sm_scale: softmax scale applied to `q @ k`.
        slopes: `num_heads` floats, the bias per unit of `k_pos - q_pos` in
            logit units (after `sm_scale`).

    Returns:
        `[T, 1, num_heads, head_dim]` in the query's dtype.
    """
    from keras import ops

    from keras_vllm.layers.context import require_context

    context = require_context(layer)
    index = layer.kv_cache_index
    new_cache, out = paged_alibi_attention(
        context.read_cache(index),
        query[:, 0],
        key[:, 0],
        value[:, 0],
        context.attention_metadata,
        sm_scale=float(sm_scale),
        alibi_slopes=[float(s) for s in slopes],
        mesh=context.mesh,
    )
    context.write_cache(index, new_cache)
    return ops.cast(out[:, None], query.dtype)


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

    Arguments and results as `keras_vllm.layers.paged_attention.
    paged_attention`, plus `alibi_slopes`: one float per query head (logit
    units, added as `slope * (k_pos - q_pos)` after `sm_scale`).
    """
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.utils import get_mesh_shape_product
    from tpu_inference.utils import get_padded_head_dim

    from keras_vllm.layers.paged_attention import _resolve_mesh

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
    kernel = functools.partial(
        ragged_alibi_attention, sm_scale=sm_scale, hd64=padded_dim == 64
    )
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


def write_kv(kv_cache, keys, values, kv_lens, page_indices, cu_q_lens,
             num_seqs, *, hd64):
    """Scatters the step's new K/V `[T, Hkv, D]` into their cache pages.

    Token `t` of live sequence `i` goes to position
    `kv_lens[i] - q_len_i + (t - cu_q_lens[i])` of that sequence; padding
    tokens are dropped. Same layout and result as the RPA kernels' write.
    """
    num_tokens = keys.shape[0]
    num_pages, page_size = kv_cache.shape[:2]
    max_num_seqs = kv_lens.shape[0]
    pages_per_seq = page_indices.shape[0] // max_num_seqs
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(cu_q_lens[1:], token, side="right")
    seq = jnp.minimum(seq, max_num_seqs - 1).astype(jnp.int32)
    live = (token < cu_q_lens[num_seqs]) & (seq < num_seqs)
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    pos = kv_lens[seq] - q_len + (token - cu_q_lens[seq])
    pos = jnp.clip(pos, 0, pages_per_seq * page_size - 1)
    page = page_indices[seq * pages_per_seq + pos // page_size]
    page = jnp.where(live, page, num_pages)  # out of range: dropped
    rows = _rpa._merge_kv(keys, values, kv_cache.shape, kv_cache.dtype, hd64)
    return kv_cache.at[page, pos % page_size].set(rows, mode="drop")


def ragged_alibi_attention(queries, keys, values, kv_cache, kv_lens,
                           page_indices, cu_q_lens, distribution, slopes, *,
                           sm_scale, hd64=False):
    """Causal ragged paged attention with an ALiBi bias (one shard).

    Args:
        queries: `[T, Hq, D]`; keys, values: `[T, Hkv, D]` (new tokens).
        kv_cache: the paged cache (RPA v3 layout; the hd64 layout when
            `hd64`), see `keras_vllm.cpu.ragged_paged_attention`.
        kv_lens, page_indices, cu_q_lens, distribution: as the RPA kernels.
        slopes: `[Hq]` float32 ALiBi slopes in logit units.
        sm_scale: softmax scale applied to `q @ k`.
        hd64: whether `kv_cache` has the head_dim == 64 layout.

    Returns:
        `(out [T, Hq, D] in the queries' dtype, new_kv_cache)`; rows of
        padding tokens are zero.
    """
    num_tokens, num_q_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    page_size = kv_cache.shape[1]
    max_num_seqs = kv_lens.shape[0]
    pages_per_seq = page_indices.shape[0] // max_num_seqs
    kv_block_pages = max(1, min(pages_per_seq, _KV_BLOCK_TOKENS // page_size))
    kv_block = kv_block_pages * page_size
    num_seqs = jnp.minimum(distribution[2], max_num_seqs)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    page_indices = page_indices.astype(jnp.int32)

    kv_cache = write_kv(kv_cache, keys, values, kv_lens, page_indices,
                        cu_q_lens, num_seqs, hd64=hd64)

    q = queries.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group,
                                            head_dim)
    # Room for a whole block past the last token (no clamped slices).
    q = jnp.pad(q, ((0, _Q_BLOCK), (0, 0), (0, 0), (0, 0)))
    out = jnp.zeros_like(q)
    slopes = slopes.astype(jnp.float32).reshape(1, num_kv_heads, group, 1)
    q_iota = jnp.arange(_Q_BLOCK, dtype=jnp.int32)
    kv_iota = jnp.arange(kv_block, dtype=jnp.int32)

    def kv_step(kv_idx, carry, seq_idx, q_blk, q_pos, q_ok, kv_len):
        m_prev, l_prev, acc = carry
        slots = jnp.minimum(kv_idx * kv_block_pages +
                            jnp.arange(kv_block_pages), pages_per_seq - 1)
        pages = page_indices[seq_idx * pages_per_seq + slots]
        block = kv_cache[pages].reshape(kv_block, *kv_cache.shape[2:])
        k, v = _rpa._split_kv(block, num_kv_heads, head_dim, hd64)
        k = k.astype(jnp.float32)
        v = v.astype(jnp.float32)
        k_pos = kv_idx * kv_block + kv_iota  # [Bk]
        distance = (k_pos[None, :] - q_pos[:, None]).astype(jnp.float32)
        s = jnp.einsum("qhgd,khd->qhgk", q_blk, k) * sm_scale
        s = s + slopes * distance[:, None, None, :]
        mask = ((k_pos[None, :] < kv_len) & q_ok[:, None] &
                (k_pos[None, :] <= q_pos[:, None]))[:, None, None, :]
        s = jnp.where(mask, s, _NEG)
        m_new = jnp.maximum(m_prev, s.max(axis=-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m_prev - m_new)
        l_new = alpha * l_prev + p.sum(axis=-1)
        acc = alpha[..., None] * acc + jnp.einsum("qhgk,khd->qhgd", p, v)
        return m_new, l_new, acc

    def q_step(q_blk_idx, out, seq_idx, q_start, q_end, kv_len):
        row0 = q_start + q_blk_idx * _Q_BLOCK
        q_blk = lax.dynamic_slice_in_dim(q, row0, _Q_BLOCK)
        rows = row0 + q_iota
        q_ok = rows < q_end
        q_pos = kv_len - (q_end - q_start) + (rows - q_start)
        last_q = jnp.minimum(row0 + _Q_BLOCK, q_end) - 1
        last_pos = kv_len - (q_end - q_start) + (last_q - q_start)
        kv_hi = jnp.minimum(kv_len, last_pos + 1)
        shape = (_Q_BLOCK, num_kv_heads, group)
        init = (jnp.full(shape, _NEG), jnp.zeros(shape),
                jnp.zeros(shape + (head_dim,)))
        _, l, acc = lax.fori_loop(
            0, (kv_hi + kv_block - 1) // kv_block,
            functools.partial(kv_step, seq_idx=seq_idx, q_blk=q_blk,
                              q_pos=q_pos, q_ok=q_ok, kv_len=kv_len), init)
        o = acc / jnp.where(l > 0, l, 1.0)[..., None]
        old = lax.dynamic_slice_in_dim(out, row0, _Q_BLOCK)
        o = jnp.where(q_ok[:, None, None, None], o, old)
        return lax.dynamic_update_slice_in_dim(out, o, row0, axis=0)

    def seq_step(seq_idx, out):
        q_start = cu_q_lens[seq_idx]
        q_end = cu_q_lens[seq_idx + 1]
        num_q_blocks = (q_end - q_start + _Q_BLOCK - 1) // _Q_BLOCK
        return lax.fori_loop(
            0, num_q_blocks,
            functools.partial(q_step, seq_idx=seq_idx, q_start=q_start,
                              q_end=q_end, kv_len=kv_lens[seq_idx]), out)

    out = lax.fori_loop(0, num_seqs, seq_step, out)[:num_tokens]
    return (out.reshape(num_tokens, num_q_heads, head_dim)
            .astype(queries.dtype), kv_cache)


__all__ = [
    "alibi_slopes",
    "paged_alibi_attention",
    "paged_attend_with_alibi",
    "ragged_alibi_attention",
]
