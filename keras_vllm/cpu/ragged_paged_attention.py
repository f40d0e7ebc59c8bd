"""tpu-inference's RPA v3 kernel signatures, served by `keras_vllm.kernels`.

tpu-inference 0.32.0 runs every attention layer through its RPA v3 Pallas
kernels (`tpu_inference/kernels/ragged_paged_attention/v3/kernel.py` and,
for head_dim 64, `kernel_hd64.py`). Those kernels only compile for TPUs: on
CPU they fail in `pltpu.get_tpu_info()` ("Unsupported TPU device kind:
cpu"), and Pallas' TPU interpret mode cannot run them either. The package's
own `ref_ragged_paged_attention` runs on CPU but is not jittable (Python
loops over concrete `distribution`/`kv_lens` values).

`apply_patches()` swaps in the two functions below on CPU. They have the
kernels' signatures and defaults and call the pure-JAX
`keras_vllm.kernels.ragged_paged_attention` with the matching cache layout.
"""

import jax.numpy as jnp

from keras_vllm import kernels


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
    mask_value=None,
    out_dtype=None,
    **kwargs,
):
    """Drop-in for tpu-inference's `kernel.ragged_paged_attention`.

    Args:
        queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens,
            distribution, attention_sink: as
            `keras_vllm.kernels.ragged_paged_attention` (default cache
            layout).
        mask_value: accepted for signature compatibility; masking here is
            exact (masked keys get probability 0).
        out_dtype: output dtype; defaults like the TPU kernel (float32 for
            float32 queries, else bfloat16).
        **kwargs: `sm_scale`, `sliding_window`, `soft_cap`, `q_scale`,
            `k_scale`, `v_scale`, `use_causal_mask`, `update_kv_cache` as the
            kernels package; TPU tuning knobs (block sizes, vmem limits,
            debug flags) are ignored.

    Returns:
        `(out [T, Hq, D], new_kv_cache)`; rows of padding tokens are zero.
    """
    del mask_value
    if out_dtype is None:
        out_dtype = (jnp.float32
                     if queries.dtype == jnp.float32 else jnp.bfloat16)
    return kernels.ragged_paged_attention(
        queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens,
        distribution, attention_sink, hd64=False, out_dtype=out_dtype,
        **_kernel_options(kwargs))


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
    mask_value=None,
    out_dtype=None,
    **kwargs,
):
    """Drop-in for tpu-inference's `kernel_hd64.ragged_paged_attention_hd64`.

    Same arguments and results as `ragged_paged_attention`, except that
    `kv_cache` has the head_dim == 64 layout and the output dtype defaults
    to the queries' dtype (as `kernel_hd64` does). The TPU hd64 kernel
    itself supports only `use_causal_mask=True` and `update_kv_cache=True`;
    this one accepts both for symmetry.
    """
    del mask_value
    return kernels.ragged_paged_attention(
        queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens,
        distribution, attention_sink, hd64=True, out_dtype=out_dtype,
        **_kernel_options(kwargs))


# The TPU kernels' keyword arguments that change the result; the others
# only tune the Pallas kernel.
_OPTIONS = ("sm_scale", "sliding_window", "soft_cap", "q_scale", "k_scale",
            "v_scale", "use_causal_mask", "update_kv_cache")


def _kernel_options(kwargs):
    return {name: kwargs[name] for name in _OPTIONS if name in kwargs}


__all__ = ["ragged_paged_attention", "ragged_paged_attention_hd64"]
