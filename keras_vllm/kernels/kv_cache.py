"""tpu-inference's paged KV cache layouts, and the write of new K/V into them.

tpu-inference 0.32.0 allocates one cache array per attention layer, in one
of two layouts (those of its RPA v3 kernels, `kernel.py` and
`kernel_hd64.py`), with `packing = 32 // dtype_bits` rows per 32-bit word:

* default: `[num_pages, page_size, align(2 * Hkv, packing) // packing,
  packing, align(D, 128)]`; row `2h` holds K of kv head `h`, row `2h + 1`
  its V (`kernel.merge_kv`).
* head_dim == 64 (`hd64`): `[num_pages, page_size, align(Hkv, packing) //
  packing, packing, 128]`; row `h` holds `concat(K_h, V_h)`
  (`kernel_hd64.merge_kv`).

The layout cannot always be told from the shape (both are 128 wide for
D == 64, and their row counts coincide for some packings), so every function
here takes it as `hd64`.
"""

import jax.numpy as jnp


def merge_kv(keys, values, cache_shape, cache_dtype, *, hd64):
    """Packs new K/V into cache rows, in the cache's layout.

    Args:
        keys: `[T, Hkv, D]` new keys.
        values: `[T, Hkv, D]` new values.
        cache_shape: the cache's shape (its last three dims are used).
        cache_dtype: the cache's dtype; the rows are cast to it.
        hd64: whether the cache has the head_dim == 64 layout.

    Returns:
        `[T, rows_per_pack, packing, width]` rows, one per token.

    Example:

    >>> import jax.numpy as jnp
    >>> k = v = jnp.ones((3, 2, 32))
    >>> merge_kv(k, v, (10, 8, 4, 1, 128), jnp.float32, hd64=False).shape
    (3, 4, 1, 128)
    """
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


def split_kv(rows, num_kv_heads, head_dim, *, hd64):
    """Unpacks cache rows into K and V (the inverse of `merge_kv`).

    Args:
        rows: `[L, rows_per_pack, packing, width]` rows of `L` tokens.
        num_kv_heads: the number of KV heads stored.
        head_dim: the head dim `D` stored.
        hd64: whether the rows have the head_dim == 64 layout.

    Returns:
        `(k, v)`, each `[L, Hkv, D]` in the cache's dtype.
    """
    length = rows.shape[0]
    rows = rows.reshape(length, -1, rows.shape[-1])
    if hd64:
        rows = rows[:, :num_kv_heads]
        return rows[..., :head_dim], rows[..., head_dim:2 * head_dim]
    rows = rows[:, :2 * num_kv_heads, :head_dim]
    return rows[:, 0::2], rows[:, 1::2]


def write_kv_cache(kv_cache, keys, values, kv_lens, page_indices, cu_q_lens,
                   num_seqs, *, hd64):
    """Scatters this step's new K/V into their cache pages (one scatter).

    Token `t` of live sequence `i` goes to position
    `kv_lens[i] - q_len_i + (t - cu_q_lens[i])` of that sequence, i.e. to
    page `page_indices[i * pages_per_seq + pos // page_size]`, slot
    `pos % page_size`. Padding tokens (past `cu_q_lens[num_seqs]`) are
    dropped, so they never touch pages that belong to live sequences. The
    result equals the RPA kernels' own cache update.

    Args:
        kv_cache: the paged cache (layout per `hd64`, see the module doc).
        keys: `[T, Hkv, D]` new keys; T may include trailing padding.
        values: `[T, Hkv, D]` new values.
        kv_lens: `int32[max_num_seqs]` KV length of each sequence,
            including this step's tokens.
        page_indices: `int32[max_num_seqs * pages_per_seq]` flattened page
            table.
        cu_q_lens: `int32[max_num_seqs + 1]` cumulative query lengths.
        num_seqs: the number of live sequences (may be traced).
        hd64: whether `kv_cache` has the head_dim == 64 layout.

    Returns:
        The updated cache.
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
    # An out-of-range page makes `mode="drop"` discard padding tokens.
    page = jnp.where(live, page, num_pages)
    rows = merge_kv(keys, values, kv_cache.shape, kv_cache.dtype, hd64=hd64)
    return kv_cache.at[page, pos % page_size].set(rows, mode="drop")
