"""A jittable, pure-JAX ragged paged attention over tpu-inference's caches.

One kernel for every paged attention keras-vllm runs without Pallas: the
CPU backend's stand-in for tpu-inference's RPA v3 kernels
(`keras_vllm.cpu`), and the ALiBi families' attention on CPU and TPU
(`keras_vllm.layers.common.alibi_attention`). It is written with `lax` control
flow, so it traces once and runs inside a jitted step function.

Semantics follow tpu-inference 0.32.0's RPA v3 kernels (verified against
their source): a query at absolute position `q` sees key `k` iff
`k < kv_len`, `k <= q` (causal) and `q - k < sliding_window`. With
`attend_until` (no RPA counterpart) a query sees keys up to its token's
`attend_until` instead of `q`: the image placeholders of a vision-language
model that attend to their whole image (Gemma 3), where the window is
then `|q - k| < sliding_window` as KerasHub's symmetric band. Logits are

    s = sm_scale * k_scale * q_scale * (q . k)
    s = soft_cap * tanh(s / soft_cap)          (if soft_cap)
    s = s + alibi_slopes[h] * (k - q)          (if alibi_slopes)

The ALiBi bias comes after the soft cap, so the cap bounds the content term
and never flattens the positional one. Softmax ignores a per-row constant,
so the bias equals every ALiBi convention that differs from it by one
(`slope * k`, `slope * (k - (kv_len - 1))`). The query of token `t` of
sequence `i` is at position `kv_lens[i] - q_len_i + (t - cu_q_lens[i])`.

Cost is proportional to the work actually present: a `fori_loop` visits
the `distribution[2]` live sequences; a sequence with one query this step
(a decode) is attended as one row, any other in blocks of `q_block`
queries (a `lax.cond` picks, so neither pays for the other's padding).
Each query block walks only the KV blocks (about `_KV_BLOCK_TOKENS`
tokens, whole pages) it can see, with an online (flash) softmax. No
token's whole context is materialised, and pages past a sequence's
`kv_len` are never read. The loops are sequential and unfused: on TPU this
is much slower than the RPA Pallas kernel. The block sizes change how the
work is split, never what a query computes (`keras_vllm.bench.kernel`
times them).
"""

import functools

import jax.numpy as jnp
from jax import lax

from keras_vllm.kernels.kv_cache import split_kv
from keras_vllm.kernels.kv_cache import write_kv_cache

# Queries handled per inner step of a multi-query (prefill) sequence: large
# enough that prefill is not loop-bound on CPU (4 x 512 tokens: 8 -> 32
# halves the layer's time); decodes take a one-row block instead.
_Q_BLOCK = 32
# Target number of KV tokens per inner step (rounded to whole pages).
_KV_BLOCK_TOKENS = 128
# Finite "minus infinity" for masked logits: (-inf) - (-inf) would be NaN in
# the online-softmax rescaling. Masked probabilities are also zeroed
# explicitly, so the value never leaks into the result.
_NEG = -1e30


def ragged_paged_attention(
    queries,
    keys,
    values,
    kv_cache,
    kv_lens,
    page_indices,
    cu_q_lens,
    distribution,
    attention_sink=None,
    *,
    hd64=False,
    sm_scale=1.0,
    sliding_window=None,
    soft_cap=None,
    alibi_slopes=None,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    use_causal_mask=True,
    attend_until=None,
    update_kv_cache=True,
    out_dtype=None,
    q_block=_Q_BLOCK,
    single_query_block=1,
):
    """Writes new K/V into a paged cache, then attends over it (ragged).

    Args:
        queries: `[T, Hq, D]` queries of all sequences, concatenated (T may
            include trailing padding tokens).
        keys: `[T, Hkv, D]` new keys, same token order.
        values: `[T, Hkv, D]` new values.
        kv_cache: the paged cache in tpu-inference's default RPA v3 layout,
            or its head_dim == 64 layout when `hd64` (see
            `keras_vllm.kernels.kv_cache`).
        kv_lens: `int32[max_num_seqs]` total KV length of each sequence,
            including this step's tokens.
        page_indices: `int32[max_num_seqs * pages_per_seq]` flattened page
            table.
        cu_q_lens: `int32[max_num_seqs + 1]` cumulative query lengths.
        distribution: `int32[3]` cumulative (decode, prefill, mixed)
            sequence counts; `distribution[2]` sequences are live.
        attention_sink: optional `[Hq]` per-head sink logits (an extra
            softmax column with no value).
        hd64: whether `kv_cache` has the head_dim == 64 layout.
        sm_scale: softmax scale applied to `Q @ K^T`.
        sliding_window: if set, a query at `q` sees keys with
            `q - k < sliding_window`.
        soft_cap: if set, logits become `soft_cap * tanh(s / soft_cap)`.
        alibi_slopes: optional `[Hq]` per-head ALiBi slopes, in logit units:
            `slope[h] * (k_pos - q_pos)` is added to the (capped) logits.
        q_scale: quantization scale of the queries (as the TPU kernel:
            queries are quantized into the cache dtype's range).
        k_scale: quantization scale of the keys.
        v_scale: quantization scale of the values.
        use_causal_mask: if False, every query sees all `kv_len` keys.
        attend_until: optional `int32[T]`: the last key position each
            token's query sees, for tokens that see past their own position
            (the rest hold their position, or less: the causal limit
            stays). Only with `use_causal_mask`; the keys must be written in
            this step or before.
        update_kv_cache: if False, the new keys/values are not written and
            attention reads the cache only (tpu-inference's "KV share").
        out_dtype: output dtype; defaults to the queries' dtype.
        q_block: queries per inner step of a multi-query sequence (speed
            only: 32 suits prefill on CPU).
        single_query_block: rows per inner step of a one-query sequence (a
            decode; speed only: 1 computes no padding rows).

    Returns:
        `(out [T, Hq, D], new_kv_cache)`; rows of padding tokens are zero.

    Example:

    >>> import jax.numpy as jnp
    >>> q = k = v = jnp.ones((3, 2, 32))         # one 3-token prefill
    >>> cache = jnp.zeros((4, 8, 4, 1, 128))     # 4 pages of 8 tokens
    >>> out, cache = ragged_paged_attention(
    ...     q, k, v, cache, kv_lens=jnp.array([3, 0]),
    ...     page_indices=jnp.array([2, 0, 1, 3]),
    ...     cu_q_lens=jnp.array([0, 3, 3]),
    ...     distribution=jnp.array([0, 1, 1]),
    ...     sm_scale=32**-0.5, alibi_slopes=[0.5, 0.25])
    >>> out.shape
    (3, 2, 32)
    """
    if out_dtype is None:
        out_dtype = queries.dtype
    num_tokens, num_q_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    page_size = kv_cache.shape[1]
    max_num_seqs = kv_lens.shape[0]
    pages_per_seq = page_indices.shape[0] // max_num_seqs
    kv_block_pages = max(1, min(pages_per_seq,
                                _KV_BLOCK_TOKENS // page_size))
    num_seqs = jnp.minimum(distribution[2], max_num_seqs)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    page_indices = page_indices.astype(jnp.int32)

    if update_kv_cache:
        kv_cache = write_kv_cache(kv_cache, keys, values, kv_lens,
                                  page_indices, cu_q_lens, num_seqs,
                                  hd64=hd64)

    # Scales may be Python floats or traced scalars; keep them symbolic.
    logit_scale = sm_scale
    if k_scale is not None:
        logit_scale = logit_scale * k_scale
    if q_scale is not None:
        logit_scale = logit_scale * q_scale
    bias = None
    if alibi_slopes is not None:
        bias = jnp.asarray(alibi_slopes, jnp.float32)
        if bias.shape != (num_q_heads,):
            raise ValueError(
                f"Expected {num_q_heads} ALiBi slopes (one per query head), "
                f"got shape {bias.shape}.")
        bias = bias.reshape(1, num_kv_heads, group, 1)
    sink = None
    if attention_sink is not None:
        sink = attention_sink.astype(jnp.float32).reshape(
            1, num_kv_heads, group)

    # The loop bodies below get their iotas from here, built once: with them
    # inside the loops XLA:CPU fuses the ALiBi add differently (1-ulp output
    # differences from the layer kernel this one replaced).
    kv_step = functools.partial(
        _kv_block_step,
        kv_cache=kv_cache,
        page_indices=page_indices,
        pages_per_seq=pages_per_seq,
        kv_block_pages=kv_block_pages,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        hd64=hd64,
        logit_scale=logit_scale,
        soft_cap=soft_cap,
        bias=bias,
        use_causal_mask=use_causal_mask,
        sliding_window=sliding_window,
        symmetric_window=attend_until is not None,
        kv_iota=jnp.arange(kv_block_pages * page_size, dtype=jnp.int32),
    )
    # Room for a full block past the last token, so block reads/writes at
    # the end never clamp (dynamic_slice would shift them onto earlier rows).
    pad = max(q_block, single_query_block)
    if attend_until is not None:
        attend_until = jnp.pad(attend_until.astype(jnp.int32), (0, pad))
    q = _prepare_queries(queries, q_scale, kv_cache.dtype, num_kv_heads, pad)
    q_iota = jnp.arange(q_block, dtype=jnp.int32)
    single_iota = jnp.arange(single_query_block, dtype=jnp.int32)
    q_step = functools.partial(
        _q_block_step,
        q=q,
        kv_step=kv_step,
        kv_block=kv_block_pages * page_size,
        sink=sink,
        use_causal_mask=use_causal_mask,
        sliding_window=sliding_window,
        attend_until=attend_until,
    )

    def seq_step(seq_idx, out):
        q_start = cu_q_lens[seq_idx]
        q_end = cu_q_lens[seq_idx + 1]

        def blocks(q_iota, out):
            size = q_iota.shape[0]
            return lax.fori_loop(
                0, (q_end - q_start + size - 1) // size,
                functools.partial(q_step, q_iota=q_iota, seq_idx=seq_idx,
                                  q_start=q_start, q_end=q_end,
                                  kv_len=kv_lens[seq_idx]), out)

        if single_query_block == q_block:
            return blocks(q_iota, out)
        return lax.cond(q_end - q_start == 1,
                        functools.partial(blocks, single_iota),
                        functools.partial(blocks, q_iota), out)

    out = jnp.zeros((num_tokens + pad, num_kv_heads, group, head_dim),
                    jnp.float32)
    out = lax.fori_loop(0, num_seqs, seq_step, out)[:num_tokens]
    if v_scale is not None:
        out = out * v_scale
    return out.reshape(num_tokens, num_q_heads,
                       head_dim).astype(out_dtype), kv_cache


def _prepare_queries(queries, q_scale, cache_dtype, num_kv_heads, pad):
    """`[T, Hq, D]` -> float32 `[T + pad, Hkv, group, D]`."""
    q = queries
    if q_scale is not None:
        # As the TPU kernel: quantize q into the cache dtype's range.
        q = q / q_scale
        if jnp.issubdtype(cache_dtype, jnp.floating):
            info = jnp.finfo(cache_dtype)
            q = jnp.clip(q, float(info.min), float(info.max))
        q = q.astype(cache_dtype)
    num_tokens, num_q_heads, head_dim = queries.shape
    q = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads,
                                      num_q_heads // num_kv_heads, head_dim)
    return jnp.pad(q, ((0, pad), (0, 0), (0, 0), (0, 0)))


def _q_block_step(q_blk_idx, out, *, seq_idx, q_start, q_end, kv_len, q,
                  kv_step, kv_block, sink, use_causal_mask, sliding_window,
                  attend_until, q_iota):
    """Attends one block of `len(q_iota)` queries of a sequence into `out`."""
    num_kv_heads, group, head_dim = q.shape[1:]
    size = q_iota.shape[0]
    row0 = q_start + q_blk_idx * size
    q_blk = lax.dynamic_slice_in_dim(q, row0, size)
    rows = row0 + q_iota
    q_ok = rows < q_end
    q_pos = kv_len - (q_end - q_start) + (rows - q_start)
    q_limit = q_pos
    if attend_until is not None:
        q_limit = jnp.maximum(
            q_pos, lax.dynamic_slice_in_dim(attend_until, row0, size)
        )
    # Only KV blocks that some query of this block can see.
    last_q = jnp.minimum(row0 + size, q_end) - 1
    last_pos = kv_len - (q_end - q_start) + (last_q - q_start)
    if attend_until is not None:
        last_pos = jnp.max(jnp.where(q_ok, q_limit, 0))
    kv_hi = jnp.minimum(kv_len, last_pos + 1) if use_causal_mask else kv_len
    kv_lo = 0
    if sliding_window is not None:
        kv_lo = jnp.maximum(q_pos[0] - sliding_window + 1, 0)
    shape = (size, num_kv_heads, group)
    if sink is not None:
        # The sink is one more softmax column with logit `sink` and a zero
        # value: start the running max at it with a running sum of 1.
        init = (jnp.broadcast_to(sink, shape), jnp.ones(shape),
                jnp.zeros(shape + (head_dim,)))
    else:
        init = (jnp.full(shape, _NEG), jnp.zeros(shape),
                jnp.zeros(shape + (head_dim,)))
    _, l, acc = lax.fori_loop(
        kv_lo // kv_block, (kv_hi + kv_block - 1) // kv_block,
        functools.partial(kv_step, seq_idx=seq_idx, q_blk=q_blk,
                          q_pos=q_pos, q_limit=q_limit, q_ok=q_ok,
                          kv_len=kv_len), init)
    o = acc / jnp.where(l > 0, l, 1.0)[..., None]
    old = lax.dynamic_slice_in_dim(out, row0, size)
    o = jnp.where(q_ok[:, None, None, None], o, old)
    return lax.dynamic_update_slice_in_dim(out, o, row0, axis=0)


def _kv_block_step(kv_idx, carry, *, seq_idx, q_blk, q_pos, q_limit, q_ok,
                   kv_len, kv_cache, page_indices, pages_per_seq,
                   kv_block_pages, num_kv_heads, head_dim, hd64, logit_scale,
                   soft_cap, bias, use_causal_mask, sliding_window,
                   symmetric_window, kv_iota):
    """One online-softmax update of a query block with one KV block."""
    m_prev, l_prev, acc = carry
    kv_block = kv_block_pages * kv_cache.shape[1]
    # Clamp the page slot so the slice stays inside this sequence's row of
    # the page table; tokens past kv_len are masked below.
    slots = jnp.minimum(kv_idx * kv_block_pages + jnp.arange(kv_block_pages),
                        pages_per_seq - 1)
    pages = page_indices[seq_idx * pages_per_seq + slots]
    block = kv_cache[pages].reshape(kv_block, *kv_cache.shape[2:])
    k, v = split_kv(block, num_kv_heads, head_dim, hd64=hd64)
    k = k.astype(jnp.float32)
    v = v.astype(jnp.float32)
    k_pos = kv_idx * kv_block + kv_iota  # [Bk]
    s = jnp.einsum("qhgd,khd->qhgk", q_blk, k) * logit_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    if bias is not None:
        distance = (k_pos[None, :] - q_pos[:, None]).astype(jnp.float32)
        s = s + bias * distance[:, None, None, :]
    mask = (k_pos[None, :] < kv_len) & q_ok[:, None]
    if use_causal_mask:
        mask &= k_pos[None, :] <= q_limit[:, None]
    if sliding_window is not None:
        mask &= q_pos[:, None] - k_pos[None, :] < sliding_window
        if symmetric_window:
            mask &= k_pos[None, :] - q_pos[:, None] < sliding_window
    mask = mask[:, None, None, :]
    s = jnp.where(mask, s, _NEG)
    m_new = jnp.maximum(m_prev, s.max(axis=-1))
    p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
    alpha = jnp.exp(m_prev - m_new)
    l_new = alpha * l_prev + p.sum(axis=-1)
    acc = alpha[..., None] * acc + jnp.einsum("qhgk,khd->qhgd", p, v)
    return m_new, l_new, acc
