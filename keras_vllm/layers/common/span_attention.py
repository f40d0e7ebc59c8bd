"""Paged attention where some tokens see past their own position.

A vision-language model's image placeholders attend to their whole image
(Gemma 3: both directions within one image's run of placeholders), text
tokens causally. tpu-inference 0.32's RPA kernels take one causal flag per
call and no per-token limit, so a step that carries image placeholders
attends through the pure-JAX `keras_vllm.kernels.ragged_paged_attention`
with `attend_until` (each token's last visible key position), on CPU and
TPU alike; steps without images keep the default path (`paged_attention`).
Everything else is as `paged_attention`: the same cache layouts, head-dim
padding, metadata and `jax.shard_map` over the mesh's attention-head axis
(`jax_kernel_attention`, shared with `alibi_attention`).

The keys a placeholder sees must be written in the same step or before, so
an image's placeholders must not be split across prefill chunks (vLLM's
`disable_chunked_mm_input`, which keras-vllm sets for image artifacts).
Nothing here names a model family.
"""

import jax.numpy as jnp

from keras_vllm.layers.common.jax_kernel_attention import (
    sharded_kernel_attention,
)


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

    # Each shard gets its tokens' limits, split like the flat batch.
    return sharded_kernel_attention(
        kv_cache, query, key, value, attention_metadata, mesh=mesh,
        per_call=(
            "attend_until", attend_until.astype(jnp.int32),
            ShardingAxisName.ATTN_DATA,
        ),
        sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
    )


__all__ = ["paged_span_attention"]
