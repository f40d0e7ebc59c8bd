"""A jittable, pure-JAX ragged paged attention for JAX CPU devices.

tpu-inference 0.32.0 runs every attention layer through its RPA v3 Pallas
kernels (`tpu_inference/kernels/ragged_paged_attention/v3/kernel.py` and, for
head_dim 64, `kernel_hd64.py`). Those kernels only compile for TPUs: on CPU
they fail in `pltpu.get_tpu_info()` ("Unsupported TPU device kind: cpu"), and
Pallas' TPU interpret mode cannot run them either. The package's own
`ref_ragged_paged_attention` runs on CPU but is not jittable (Python loops
over concrete `distribution`/`kv_lens` values).

This module provides drop-in replacements with the kernels' signatures and
KV-cache layouts, written with `lax` control flow so they trace once and run
inside tpu-inference's jitted step function:

* `ragged_paged_attention`: the default kernel. Cache layout
  `[num_pages, page_size, align(2 * Hkv, packing) // packing, packing,
  align(D, 128)]`; row `2h` holds K of kv head `h`, row `2h + 1` its V
  (`kernel.merge_kv`); `packing = 32 // dtype_bits`.
* `ragged_paged_attention_hd64`: the head_dim == 64 kernel. Cache layout
  `[num_pages, page_size, align(Hkv, packing) // packing, packing, 128]`;
  row `h` holds `concat(K_h, V_h)` (`kernel_hd64.merge_kv`).

Semantics follow the TPU kernels (verified against the 0.32.0 source):
a query at absolute position `q` sees key `k` iff `k < kv_len`, `k <= q`
(causal), and `q - k < sliding_window`; logits are
`soft_cap * tanh(s / soft_cap)` after `sm_scale * k_scale * q_scale`. The
query of token `t` of sequence `i` is at position
`kv_lens[i] - q_len_i + (t - cu_q_lens[i])`. New keys/values are written into
the pages before attention (unless `update_kv_cache=False`, tpu-inference's
"KV share" mode, where the cache already holds them).

Cost is proportional to the work actually present: a `fori_loop` visits the
`distribution[2]` live sequences; each one is processed in blocks of
`_Q_BLOCK` queries, and each query block walks only the KV blocks it can see
(`[first visible key, last visible key]`) with an online (flash) softmax. No
token's whole context is ever materialised, and padding pages past a
sequence's `kv_len` are never read.
"""

import functools

import jax.numpy as jnp
from jax import lax

# Queries handled per inner step. Small, because on CPU a decode step of a
# sequence (one query) still pays for a whole block.
_Q_BLOCK = 8
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
    sm_scale=1.0,
    sliding_window=None,
    soft_cap=None,
    mask_value=None,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    use_causal_mask=True,
    update_kv_cache=True,
    out_dtype=None,
    **ignored,
):
    """Ragged paged attention over a paged KV cache (RPA v3 layout).

    Args:
        queries: `[T, Hq, D]` queries of all sequences, concatenated (T may
            include trailing padding tokens).
        keys: `[T, Hkv, D]` new keys, same token order.
        values: `[T, Hkv, D]` new values.
        kv_cache: `[num_pages, page_size, align(2 * Hkv, packing) // packing,
            packing, align(D, 128)]` paged cache.
        kv_lens: `int32[max_num_seqs]` total KV length of each sequence,
            including this step's tokens.
        page_indices: `int32[max_num_seqs * pages_per_seq]` flattened page
            table.
        cu_q_lens: `int32[max_num_seqs + 1]` cumulative query lengths.
        distribution: `int32[3]` cumulative (decode, prefill, mixed)
            sequence counts; `distribution[2]` sequences are live.
        attention_sink: optional `[Hq]` per-head sink logits (an extra
            softmax column with no value).
        sm_scale: softmax scale applied to `Q @ K^T`.
        sliding_window: if set, a query at `q` sees keys with
            `q - k < sliding_window`.
        soft_cap: if set, logits become `soft_cap * tanh(s / soft_cap)`.
        mask_value: accepted for signature compatibility; masking here is
            exact (masked keys get probability 0).
        q_scale: quantization scale of the queries.
        k_scale: quantization scale of the keys.
        v_scale: quantization scale of the values.
        use_causal_mask: if False, every query sees all `kv_len` keys.
        update_kv_cache: if False, the new keys/values are not written and
            attention reads the cache only (tpu-inference "KV share").
        out_dtype: output dtype; defaults like the TPU kernel (float32 for
            float32 queries, else bfloat16).
        **ignored: TPU tuning knobs (block sizes, vmem limits, debug flags).

    Returns:
        `(out [T, Hq, D], new_kv_cache)`; rows of padding tokens are zero.
    """
    del mask_value, ignored
    if out_dtype is None:
        out_dtype = (jnp.float32
                     if queries.dtype == jnp.float32 else jnp.bfloat16)
    return _rpa(queries, keys, values, kv_cache, kv_lens, page_indices,
                cu_q_lens, distribution, attention_sink,
                hd64=False,
                sm_scale=sm_scale,
                sliding_window=sliding_window,
                soft_cap=soft_cap,
                q_scale=q_scale,
                k_scale=k_scale,
                v_scale=v_scale,
                use_causal_mask=use_causal_mask,
                update_kv_cache=update_kv_cache,
                out_dtype=out_dtype)


def ragged_paged_attention_hd64(
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
    sm_scale=1.0,
    sliding_window=None,
    soft_cap=None,
    mask_value=None,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    use_causal_mask=True,
    update_kv_cache=True,
    out_dtype=None,
    **ignored,
):
    """Ragged paged attention for head_dim 64 (the hd64 kernel's layout).

    Same arguments and results as `ragged_paged_attention`, except that
    `kv_cache` is `[num_pages, page_size, align(Hkv, packing) // packing,
    packing, 128]` with row `h` = `concat(K_h, V_h)`, and the output dtype
    defaults to the queries' dtype (as `kernel_hd64` does). The TPU hd64
    kernel itself supports only `use_causal_mask=True` and
    `update_kv_cache=True`; this implementation accepts both for symmetry.
    """
    del mask_value, ignored
    if out_dtype is None:
        out_dtype = queries.dtype
    return _rpa(queries, keys, values, kv_cache, kv_lens, page_indices,
                cu_q_lens, distribution, attention_sink,
                hd64=True,
                sm_scale=sm_scale,
                sliding_window=sliding_window,
                soft_cap=soft_cap,
                q_scale=q_scale,
                k_scale=k_scale,
                v_scale=v_scale,
                use_causal_mask=use_causal_mask,
                update_kv_cache=update_kv_cache,
                out_dtype=out_dtype)


def _merge_kv(keys, values, cache_shape, cache_dtype, hd64):
    """New K/V `[T, Hkv, D]` -> cache rows `[T, rows, packing, width]`."""
    num_tokens, num_kv_heads, head_dim = keys.shape
    _, _, rows_per_pack, packing, width = cache_shape
    rows = rows_per_pack * packing
    kv = jnp.concatenate([keys, values], axis=-1)  # [T, Hkv, 2D]
    if hd64:
        # One row per head: [K_h | V_h] fills the 128-wide row exactly.
        kv = jnp.pad(kv, ((0, 0), (0, rows - num_kv_heads),
                          (0, width - 2 * head_dim)))
    else:
        # Two rows per head, interleaved: row 2h = K_h, row 2h+1 = V_h.
        kv = kv.reshape(num_tokens, 2 * num_kv_heads, head_dim)
        kv = jnp.pad(kv, ((0, 0), (0, rows - 2 * num_kv_heads),
                          (0, width - head_dim)))
    return kv.reshape(num_tokens, rows_per_pack, packing,
                      width).astype(cache_dtype)


def _split_kv(block, num_kv_heads, head_dim, hd64):
    """Cache rows `[L, rows_per_pack, packing, width]` -> K, V `[L, Hkv, D]`."""
    length = block.shape[0]
    rows = block.reshape(length, -1, block.shape[-1])
    if hd64:
        rows = rows[:, :num_kv_heads]
        return rows[..., :head_dim], rows[..., head_dim:2 * head_dim]
    rows = rows[:, :2 * num_kv_heads, :head_dim]
    return rows[:, 0::2], rows[:, 1::2]


def _rpa(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens,
         distribution, attention_sink, *, hd64, sm_scale, sliding_window,
         soft_cap, q_scale, k_scale, v_scale, use_causal_mask,
         update_kv_cache, out_dtype):
    num_tokens, num_q_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    num_pages, page_size = kv_cache.shape[:2]
    max_num_seqs = kv_lens.shape[0]
    pages_per_seq = page_indices.shape[0] // max_num_seqs
    kv_block_pages = max(1, min(pages_per_seq,
                                _KV_BLOCK_TOKENS // page_size))
    kv_block = kv_block_pages * page_size
    num_seqs = jnp.minimum(distribution[2], max_num_seqs)
    kv_lens = kv_lens.astype(jnp.int32)
    cu_q_lens = cu_q_lens.astype(jnp.int32)
    page_indices = page_indices.astype(jnp.int32)

    # ---- 1. Write this step's K/V into the pages (one scatter, O(T)). ----
    if update_kv_cache:
        token = jnp.arange(num_tokens, dtype=jnp.int32)
        seq = jnp.searchsorted(cu_q_lens[1:], token, side="right")
        seq = jnp.minimum(seq, max_num_seqs - 1).astype(jnp.int32)
        live = (token < cu_q_lens[num_seqs]) & (seq < num_seqs)
        q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
        pos = kv_lens[seq] - q_len + (token - cu_q_lens[seq])
        pos = jnp.clip(pos, 0, pages_per_seq * page_size - 1)
        page = page_indices[seq * pages_per_seq + pos // page_size]
        # Padding tokens get an out-of-range page and are dropped, so they
        # never touch pages that belong to live sequences.
        page = jnp.where(live, page, num_pages)
        new_rows = _merge_kv(keys, values, kv_cache.shape, kv_cache.dtype,
                             hd64)
        kv_cache = kv_cache.at[page, pos % page_size].set(new_rows,
                                                          mode="drop")

    # ---- 2. Attention, per sequence, per query block, per KV block. ----
    q = queries
    if q_scale is not None:
        # As the TPU kernel: quantize q into the cache dtype's range.
        q = q / q_scale
        if jnp.issubdtype(kv_cache.dtype, jnp.floating):
            info = jnp.finfo(kv_cache.dtype)
            q = jnp.clip(q, float(info.min), float(info.max))
        q = q.astype(kv_cache.dtype)
    q = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group,
                                      head_dim)
    # Room for a full block past the last token, so block reads/writes at the
    # end never clamp (dynamic_slice would shift them onto earlier rows).
    q = jnp.pad(q, ((0, _Q_BLOCK), (0, 0), (0, 0), (0, 0)))
    out = jnp.zeros_like(q)

    # Scales may be Python floats or traced scalars; keep them symbolic.
    logit_scale = sm_scale
    if k_scale is not None:
        logit_scale = logit_scale * k_scale
    if q_scale is not None:
        logit_scale = logit_scale * q_scale

    if attention_sink is not None:
        sink = attention_sink.astype(jnp.float32).reshape(
            1, num_kv_heads, group)
    q_iota = jnp.arange(_Q_BLOCK, dtype=jnp.int32)
    kv_iota = jnp.arange(kv_block, dtype=jnp.int32)

    def kv_step(kv_idx, carry, seq_idx, q_blk, q_pos, q_ok, kv_len):
        m_prev, l_prev, acc = carry
        first_page = kv_idx * kv_block_pages
        # Clamp the page slot so the slice stays inside this sequence's row
        # of the page table; tokens past kv_len are masked below.
        slots = jnp.minimum(first_page + jnp.arange(kv_block_pages),
                            pages_per_seq - 1)
        pages = page_indices[seq_idx * pages_per_seq + slots]
        block = kv_cache[pages].reshape(kv_block, *kv_cache.shape[2:])
        k, v = _split_kv(block, num_kv_heads, head_dim, hd64)
        k = k.astype(jnp.float32)
        v = v.astype(jnp.float32)
        k_pos = kv_idx * kv_block + kv_iota  # [Bk]
        s = jnp.einsum("qhgd,khd->qhgk", q_blk, k) * logit_scale
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        mask = (k_pos[None, :] < kv_len) & q_ok[:, None]
        if use_causal_mask:
            mask &= k_pos[None, :] <= q_pos[:, None]
        if sliding_window is not None:
            mask &= q_pos[:, None] - k_pos[None, :] < sliding_window
        mask = mask[:, None, None, :]
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
        # Only KV blocks that some query of this block can see.
        last_q = jnp.minimum(row0 + _Q_BLOCK, q_end) - 1
        last_pos = kv_len - (q_end - q_start) + (last_q - q_start)
        kv_hi = jnp.minimum(kv_len, last_pos + 1) if use_causal_mask else kv_len
        kv_lo = 0
        if sliding_window is not None:
            kv_lo = jnp.maximum(q_pos[0] - sliding_window + 1, 0)
        blk_lo = kv_lo // kv_block
        blk_hi = (kv_hi + kv_block - 1) // kv_block
        shape = (_Q_BLOCK, num_kv_heads, group)
        if attention_sink is not None:
            # The sink is one more softmax column with logit `sink` and a zero
            # value: start the running max at it with a running sum of 1.
            init = (jnp.broadcast_to(sink, shape), jnp.ones(shape),
                    jnp.zeros(shape + (head_dim,)))
        else:
            init = (jnp.full(shape, _NEG), jnp.zeros(shape),
                    jnp.zeros(shape + (head_dim,)))
        _, l, acc = lax.fori_loop(
            blk_lo, blk_hi,
            functools.partial(kv_step, seq_idx=seq_idx, q_blk=q_blk,
                              q_pos=q_pos, q_ok=q_ok, kv_len=kv_len), init)
        o = acc / jnp.where(l > 0, l, 1.0)[..., None]
        old = lax.dynamic_slice_in_dim(out, row0, _Q_BLOCK)
        o = jnp.where(q_ok[:, None, None, None], o, old)
        return lax.dynamic_update_slice_in_dim(out, o, row0, axis=0)

    def seq_step(seq_idx, out):
        q_start = cu_q_lens[seq_idx]
        q_end = cu_q_lens[seq_idx + 1]
        kv_len = kv_lens[seq_idx]
        num_q_blocks = (q_end - q_start + _Q_BLOCK - 1) // _Q_BLOCK
        return lax.fori_loop(
            0, num_q_blocks,
            functools.partial(q_step, seq_idx=seq_idx, q_start=q_start,
                              q_end=q_end, kv_len=kv_len), out)

    out = lax.fori_loop(0, num_seqs, seq_step, out)
    out = out[:num_tokens]
    if v_scale is not None:
        out = out * v_scale
    return out.reshape(num_tokens, num_q_heads,
                       head_dim).astype(out_dtype), kv_cache


__all__ = ["ragged_paged_attention", "ragged_paged_attention_hd64"]
