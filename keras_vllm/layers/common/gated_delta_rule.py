"""The fused conv1d + gated delta rule (Gated DeltaNet) kernel a layer runs.

tpu-inference 0.32 runs linear-attention layers through
`layers/common/gdn_attention.py::run_jax_gdn_attention`, which shard-maps a
per-shard kernel: by default the GDN v3 fused conv1d + delta-rule Pallas
kernel (`GDNLinearAttentionBackend.conv1d_gdn_kernel()`), which runs on a
TPU only and, there, only for head sizes that are whole multiples of the
chip's 128 lanes: its chunked (prefill) path splits each head into
128-lane columns (`kernels/gdn/v3/vmem_ldst.py::load_as_qkv_large`), and a
16-wide head has none: `ValueError: Need at least one array to
concatenate`, deep inside an engine step.

`conv1d_gdn` below is a portable kernel with the same signature, composed
of tpu-inference's own pure-JAX references
(`layers/common/ragged_conv1d_jax.py::ragged_conv1d` and
`kernels/gdn/reference/ragged_gated_delta_rule_ref.py::
ragged_gated_delta_rule`), which read and write each request's state slot
over vLLM's flat ragged batch (decodes, prefills and chunked-prefill
continuations in one step). It runs on any JAX device; `kernel_for` picks
it wherever the Pallas kernel cannot run the layer's shapes (JAX CPU
devices, and head sizes the Pallas kernel does not take), and the Pallas
kernel everywhere else (every Qwen 3.5 preset: 128-wide heads).
"""

import logging

logger = logging.getLogger("keras_vllm")

# Lanes of a TPU vector register (every generation tpu-inference supports);
# asked of the chip where one is visible.
_DEFAULT_LANES = 128
_warned = set()


def pallas_takes(key_head_dim, value_head_dim, lanes=_DEFAULT_LANES):
    """Whether the GDN v3 Pallas kernel runs heads of these sizes: each a
    whole number of `lanes`-wide columns."""
    return key_head_dim % lanes == 0 and value_head_dim % lanes == 0


def kernel_for(key_head_dim, value_head_dim):
    """The per-shard kernel for `run_jax_gdn_attention`'s
    `conv1d_gdn_kernel`: None (tpu-inference's default, the Pallas kernel)
    on a TPU for head sizes it takes, else the portable `conv1d_gdn`.

    Decided at trace time from JAX's default backend, like the choice of
    attention kernel. The fallback on a TPU is logged once per head shape:
    it is correct but runs the delta rule token by token.

    Args:
        key_head_dim: int. The width of a key (and query) head.
        value_head_dim: int. The width of a value head.

    Returns:
        None, or `conv1d_gdn`.
    """
    import jax

    if jax.default_backend() != "tpu":
        return conv1d_gdn
    if pallas_takes(key_head_dim, value_head_dim, _tpu_lanes()):
        return None
    shape = (key_head_dim, value_head_dim)
    if shape not in _warned:
        _warned.add(shape)
        logger.warning(
            "keras-vllm: linear-attention heads of %d (key) and %d (value) "
            "dims: tpu-inference's GDN Pallas kernel takes multiples of %d "
            "only, so these layers run the portable JAX gated delta rule "
            "(exact, slower).", key_head_dim, value_head_dim, _tpu_lanes(),
        )
    return conv1d_gdn


def _tpu_lanes():
    from jax.experimental.pallas import tpu as pltpu

    try:
        return int(pltpu.get_tpu_info().num_lanes)
    except Exception:  # an older JAX without the query: every TPU has 128
        return _DEFAULT_LANES


def has_initial_state(query_start_loc, seq_lens):
    """Per request, whether its state slot already holds its state: it has
    tokens before this step's (a decode or a later prefill chunk), as the
    GDN v3 kernel's metadata decides (`seq_lens - query_lens > 0`)."""
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    return (seq_lens[: query_lens.shape[0]] - query_lens) > 0


def fresh_conv_windows(conv_state, state_indices, initial, distribution):
    """`conv_state` with the slots of new requests zeroed.

    `ragged_conv1d` honours `has_initial_state` only on its mixed-prefill
    path: when every request of a step has one token (decodes, and a new
    one-token prompt among them), its decode-only path reads each slot as
    it is, so a one-token prompt would convolve with the window a finished
    request left in its slot. The delta-rule reference masks its initial
    state itself.
    """
    import jax.numpy as jnp

    requests = jnp.arange(state_indices.shape[0])
    # Padding rows (past the step's requests) keep their slot as it is.
    fresh = (~initial) & (requests < distribution[2])
    windows = conv_state[state_indices]
    windows = jnp.where(fresh[:, None, None], 0, windows).astype(
        conv_state.dtype
    )
    return conv_state.at[state_indices].set(windows)


def conv1d_gdn(
    mixed_qkv,
    b,
    a,
    conv_state,
    recurrent_state,
    conv_weight,
    conv_bias,
    A_log,
    dt_bias,
    query_start_loc,
    state_indices,
    distribution,
    seq_lens,
    read_state_indices,
    *,
    n_kq,
    n_v,
    d_k,
    d_v,
    kernel_size,
):
    """Causal conv1d then the gated delta rule, per request's state slot.

    The arguments and return value are those of tpu-inference 0.32's
    `Conv1dGDNKernel` (see `run_jax_gdn_attention`); `read_state_indices`
    must equal `state_indices` (no mamba prefix caching).

    Returns:
        `((new_conv_state, new_recurrent_state), out)`, `out` of shape
        `[num_tokens, n_v * d_v]`.
    """
    from tpu_inference.kernels.gdn.reference import (
        ragged_gated_delta_rule_ref as delta_rule,
    )
    from tpu_inference.layers.common import ragged_conv1d_jax

    del read_state_indices  # equal to state_indices without prefix caching
    initial = has_initial_state(query_start_loc, seq_lens)
    initial = initial[: state_indices.shape[0]]
    conv_state = fresh_conv_windows(
        conv_state, state_indices, initial, distribution
    )
    mixed_qkv, new_conv_state = ragged_conv1d_jax.ragged_conv1d(
        mixed_qkv,
        conv_state,
        conv_weight,
        conv_bias,
        query_start_loc,
        state_indices,
        distribution,
        initial,
        kernel_size=kernel_size,
    )
    new_recurrent_state, out = delta_rule.ragged_gated_delta_rule(
        mixed_qkv,
        b,
        a,
        recurrent_state,
        A_log,
        dt_bias,
        query_start_loc,
        state_indices,
        distribution,
        initial,
        n_kq=n_kq,
        n_v=n_v,
        d_k=d_k,
        d_v=d_v,
    )
    return (new_conv_state, new_recurrent_state), out
