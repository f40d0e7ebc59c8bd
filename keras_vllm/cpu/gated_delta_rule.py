"""The gated delta rule (Gated DeltaNet linear attention) on JAX CPU devices.

tpu-inference 0.32 runs linear-attention layers through
`layers/common/gdn_attention.py::run_jax_gdn_attention`, whose per-shard
kernel (`GDNLinearAttentionBackend.conv1d_gdn_kernel()`, the GDN v3 fused
conv1d + delta-rule kernel) is Pallas and runs on TPU only.
`keras_vllm.cpu.patches` makes that backend return `conv1d_gdn` below on
CPU: the same signature, composed of tpu-inference's own pure-JAX
references (`layers/common/ragged_conv1d_jax.py::ragged_conv1d` and
`kernels/gdn/reference/ragged_gated_delta_rule_ref.py::
ragged_gated_delta_rule`), which read and write each request's state slot
over vLLM's flat ragged batch (decodes, prefills and chunked-prefill
continuations in one step).
"""


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
