"""Computing only the experts each token is routed to (grouped matmuls).

KerasHub's mixture-of-experts blocks multiply every token by every expert
and weight the results afterwards. Served, that reads all `E` experts'
weights per step where `k` would do. This module computes an expert
feed-forward over token groups instead: the `T * k` (token, expert) pairs
are sorted by expert (stable: a token's slots keep their order), each
expert's rows form a contiguous group, and each group is multiplied by its
own expert's kernels only.

On CPU (XLA), the groups run as a loop over tiles of `tile_rows` sorted
rows: a tile belongs to one expert (`ceil(group / tile_rows)` tiles per
expert), and the loop's trip count is the number of tiles in use, so an
expert no token picked is never read. `jax.lax.ragged_dot` computes the
same thing but XLA's CPU lowering multiplies every group by every expert
(measured 50x slower than this loop on a decode step, see
docs/benchmarks.md, "Mixture of experts"); gathering each pair's kernels
(`W[experts]`) copies `T * k` experts per step. On TPU, each projection
runs as tpu-inference's grouped matmul kernel (`gmm_v2`, what its own MoE
models use) over the same sorted rows, on a single device; a
tensor-parallel TPU engine runs the XLA loop.

Nothing here names a model family: the family's layer module says how
tokens are routed and what an expert computes
(`keras_vllm.layers.common.routed_experts`).
"""

import jax
import jax.numpy as jnp
from jax import lax


def tile_rows_for(num_pairs, num_experts):
    """Rows per tile: about one tile per expert when routing is balanced,
    so each expert's kernels are read about once per step and few rows are
    computed only to be masked (one row per tile for a decode step of a
    few sequences: each pair then reads its expert once)."""
    return max(1, -(-num_pairs // num_experts))


def sort_pairs(experts, num_valid, num_experts):
    """Sorts a step's (token, slot) pairs by expert.

    Args:
        experts: int `[T, k]`, each token's experts in routing order.
        num_valid: the real tokens (the rest of the `T` rows are the
            bucket's padding): a scalar count of leading real rows, or a
            `[T]` bool mask (a data-parallel batch pads each replica's
            block), or None when all are real.
        num_experts: `E`.

    Returns:
        `(order, counts)`: `order` `[T * k]` lists the flat pair indices
        sorted by expert (padding pairs last, in no group); `counts` `[E]`
        is each expert's group size.
    """
    tokens, k = experts.shape
    flat = experts.reshape(-1).astype(jnp.int32)
    if num_valid is not None:
        pair_token = jnp.arange(tokens * k) // k
        if jnp.ndim(num_valid) == 1:
            real = jnp.take(num_valid, pair_token)
        else:
            real = pair_token < num_valid
        flat = jnp.where(real, flat, num_experts)  # past every group
    order = jnp.argsort(flat, stable=True)
    counts = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1, mode="drop")
    return order, counts


def _tiles(counts, tile_rows, max_tiles):
    """Per tile: its expert, first row, and the end of its expert's group."""
    tiles = -(-counts // tile_rows)
    tile_end = jnp.cumsum(tiles)
    tile_start = tile_end - tiles
    group_end = jnp.cumsum(counts)
    group_start = group_end - counts
    ids = jnp.arange(max_tiles)
    # The expert of tile i: how many experts' tiles end at or before it
    # (a [tiles, E] comparison; `searchsorted` is a loop on CPU).
    expert = jnp.sum(tile_end[None, :] <= ids[:, None], axis=1)
    expert = jnp.minimum(expert, counts.shape[0] - 1).astype(jnp.int32)
    first = group_start[expert] + (ids - tile_start[expert]) * tile_rows
    return expert, first, group_end[expert], tile_end[-1]


def grouped_ffn_cpu(rows, counts, expert_fn, kernels, tile_rows):
    """`expert_fn` over each expert's group of sorted rows, XLA loop.

    Args:
        rows: `[N, H]`, sorted by expert (groups in expert order, then rows
            in no group).
        counts: int `[E]`, group sizes.
        expert_fn: `(tile [B, H], *expert_kernels) -> [B, H_out]`.
        kernels: the experts' kernels, each `[E, ...]`.
        tile_rows: rows per tile (static).

    Returns:
        `[N, H_out]`; rows in no group are zeros.
    """
    num_rows = rows.shape[0]
    num_experts = counts.shape[0]
    max_tiles = num_experts + -(-num_rows // tile_rows)
    expert, first, group_end, used = _tiles(counts, tile_rows, max_tiles)
    padded = jnp.concatenate(
        [rows, jnp.zeros((tile_rows,) + rows.shape[1:], rows.dtype)]
    )
    out_shape = jax.eval_shape(
        expert_fn, padded[:tile_rows], *[k[0] for k in kernels]
    )

    def body(i, acc):
        start = first[i]
        tile = lax.dynamic_slice_in_dim(padded, start, tile_rows)
        own = [lax.dynamic_index_in_dim(k, expert[i], keepdims=False)
               for k in kernels]
        out = expert_fn(tile, *own)
        # Rows past the group belong to the next expert (or none): zero
        # them and add, so each row receives its own expert's output only.
        mine = start + jnp.arange(tile_rows) < group_end[i]
        out = jnp.where(mine[:, None], out, jnp.zeros_like(out))
        held = lax.dynamic_slice_in_dim(acc, start, tile_rows)
        return lax.dynamic_update_slice_in_dim(acc, held + out, start, 0)

    acc = jnp.zeros((num_rows + tile_rows,) + out_shape.shape[1:],
                    out_shape.dtype)
    return lax.fori_loop(0, used, body, acc)[:num_rows]


def grouped_matmul_tpu(rows, counts, kernel):
    """`rows @ kernel[e]` for each expert's group, by tpu-inference's
    grouped matmul kernel (TPU only); rows in no group are zeros."""
    from tpu_inference.layers.common.fused_moe_gmm import gmm_wrapper

    out = gmm_wrapper(
        rows, kernel, None, None, counts, jnp.zeros((1,), jnp.int32)
    )
    # The kernel leaves rows past the last group uninitialized.
    grouped = jnp.arange(rows.shape[0]) < jnp.sum(counts)
    return jnp.where(grouped[:, None], out, jnp.zeros_like(out))


def tpu_kernel_fits(mesh):
    """Whether to run tpu-inference's grouped matmul kernel: on TPU, on one
    device (the Pallas kernel takes whole arrays; split over a mesh it needs
    tpu-inference's `shard_map` plumbing, so there the XLA loop runs)."""
    if jax.devices()[0].platform != "tpu":
        return False
    return mesh is None or mesh.size == 1
