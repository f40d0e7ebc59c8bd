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

With speculative decoding a verify step runs drafted tokens through the
layer, and a rejected draft must leave no trace in the state. vLLM's runner
gives each request a group of `num_speculative_tokens + 1` state slots
(tpu-inference's `InputBatch.mamba_slot_stride`; `mamba_state_indices` is
the group's first). `conv1d_gdn_windowed` keeps in them the state after
each of the request's last `window` positions, so the next step starts
from the accepted token's state whatever was rejected; `kernel_for` picks
it whenever the engine speculates, on every backend: tpu-inference 0.32's
op never passes the Pallas kernel's own per-draft arguments
(`read_offsets`, `num_spec_tokens`).
"""

import functools
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


def kernel_for(key_head_dim, value_head_dim, state_window=1):
    """The per-shard kernel for `run_jax_gdn_attention`'s
    `conv1d_gdn_kernel`: None (tpu-inference's default, the Pallas kernel)
    on a TPU for head sizes it takes, else the portable `conv1d_gdn`; with
    a state window (speculative decoding), `conv1d_gdn_windowed`.

    Decided at trace time from JAX's default backend, like the choice of
    attention kernel. The fallbacks on a TPU are logged once per head shape:
    they are correct but run the delta rule token by token.

    Args:
        key_head_dim: int. The width of a key (and query) head.
        value_head_dim: int. The width of a value head.
        state_window: int. State slots per request: the engine's
            `num_speculative_tokens + 1` (1 without speculation).

    Returns:
        None, `conv1d_gdn`, or `conv1d_gdn_windowed` bound to the window.
    """
    import jax

    on_tpu = jax.default_backend() == "tpu"
    shape = (key_head_dim, value_head_dim)
    pallas = on_tpu and pallas_takes(*shape, _tpu_lanes())
    if state_window > 1:
        if pallas:
            _warn_once(
                ("window",) + shape,
                "keras-vllm: speculative decoding on linear-attention "
                "layers: tpu-inference 0.32 does not pass its GDN Pallas "
                "kernel the draft positions it needs to roll rejected "
                "drafts back, so these layers run the portable JAX gated "
                "delta rule, keeping a state per draft position (exact; "
                "slower, prefills most). Serve without speculative_config "
                "for the Pallas kernel.",
            )
        return functools.partial(
            conv1d_gdn_windowed, window=int(state_window)
        )
    if pallas:
        return None
    if on_tpu:
        _warn_once(
            shape,
            "keras-vllm: linear-attention heads of %d (key) and %d (value) "
            "dims: tpu-inference's GDN Pallas kernel takes multiples of %d "
            "only, so these layers run the portable JAX gated delta rule "
            "(exact, slower)." % (key_head_dim, value_head_dim, _tpu_lanes()),
        )
    return conv1d_gdn


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


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


def window_slots(query_start_loc, state_indices, distribution, seq_lens,
                 num_tokens, window):
    """Per token of the flat batch, the state slots it reads and writes.

    A token at position p of its request reads the slot holding the state
    after p - 1 and writes the one for p: `base + p % window`, `base` the
    request's first slot. Padding tokens (past the step's requests) write
    the null slot 0, which no request reads.

    Returns:
        `(read, write, fresh, valid)`, each `[num_tokens]`: the slots, whether
        the token starts its sequence (p == 0: it reads zeros, whatever a
        finished request left in the slot), and whether it is a real token.
    """
    import jax.numpy as jnp

    max_reqs = state_indices.shape[0]
    requests = distribution[2]
    # Offsets past the step's requests repeat its last, so that a padding
    # token falls in no request's range.
    starts = jnp.where(
        jnp.arange(query_start_loc.shape[0]) <= requests,
        query_start_loc, query_start_loc[requests],
    )
    token = jnp.arange(num_tokens)
    request = jnp.clip(
        jnp.searchsorted(starts, token, side="right") - 1, 0, max_reqs - 1
    )
    valid = token < starts[requests]
    query_lens = starts[1:] - starts[:-1]
    # Tokens each request had before this step.
    before = seq_lens[:max_reqs] - query_lens[:max_reqs]
    position = before[request] + token - starts[request]
    base = state_indices[request]
    read = base + jnp.mod(position - 1, window)
    write = jnp.where(valid, base + jnp.mod(position, window), 0)
    return read, write, position == 0, valid


def conv1d_gdn_windowed(
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
    window,
):
    """`conv1d_gdn` keeping one state per draft position (speculation).

    Request r owns the slots `state_indices[r] + [0, window)` (the runner's
    slot group). The state after the token at position p, its conv window
    and its delta-rule matrix, lives in slot `state_indices[r] + p %
    window` (`window_slots`). A verify step of w <= window tokens from
    position C leaves the states after C .. C + w - 1 in place, and the
    next step, which starts right after the last accepted token, reads
    that token's state: rejected drafts need no rollback, and the kernel
    needs nothing from the runner but the positions it passes already.
    With `window` 1 the layout is `conv1d_gdn`'s.

    Tokens run one at a time (a `lax.scan` over the flat batch), so what a
    token computes does not depend on how steps cut the sequence: accepted
    drafts get, bit for bit, what decoding them one a step gives.

    Args: those of `conv1d_gdn`, and `window`, the engine's
    `num_speculative_tokens + 1`; `conv_weight` is `[conv_dim, 1,
    kernel_size]`.

    Returns:
        `((new_conv_state, new_recurrent_state), out)`, `out` of shape
        `[num_tokens, n_v * d_v]`.
    """
    import jax
    import jax.numpy as jnp
    from tpu_inference.kernels.gdn.reference import (
        ragged_gated_delta_rule_ref as delta_rule,
    )

    del read_state_indices, kernel_size  # no prefix caching; from the weight
    read, write, fresh, valid = window_slots(
        query_start_loc, state_indices, distribution, seq_lens,
        mixed_qkv.shape[0], window,
    )
    weight = conv_weight[:, 0, :].astype(jnp.float32)  # [conv_dim, kernel]
    key_dim = n_kq * d_k
    # The decay and write gate per token, in f32 as the reference has them.
    beta = jax.nn.sigmoid(b.astype(jnp.float32))
    decay = -jnp.exp(A_log.astype(jnp.float32)) * jax.nn.softplus(
        a.astype(jnp.float32) + dt_bias.astype(jnp.float32)
    )

    def heads(x, count, width):
        # [count * width] -> [1, n_v, 1, width] in f32, key/query heads
        # repeated to the value heads (the reference's layout).
        x = x.reshape(1, 1, count, width)
        if count < n_v:
            x = jnp.repeat(x, n_v // count, axis=2)
        return jnp.transpose(x, (0, 2, 1, 3)).astype(jnp.float32)

    def step(states, token):
        convs, matrices = states
        x, beta_t, decay_t, src, dst, new = token
        # The last kernel_size - 1 inputs before this token, then it.
        past = jnp.where(new, 0, convs[src]).astype(convs.dtype)
        inputs = jnp.concatenate([past, x[None].astype(convs.dtype)], 0)
        mixed = jnp.einsum(
            "kd,dk->d", inputs.astype(jnp.float32), weight,
            precision=jax.lax.Precision.HIGHEST,
        )
        if conv_bias is not None:
            mixed = mixed + conv_bias.astype(jnp.float32)
        # Rounded to the activations' dtype before SiLU, as between
        # tpu-inference's conv and delta-rule references.
        mixed = jax.nn.silu(mixed.astype(x.dtype))
        convs = convs.at[dst].set(inputs[1:])
        q = delta_rule._l2_normalize(heads(mixed[:key_dim], n_kq, d_k))
        k = delta_rule._l2_normalize(
            heads(mixed[key_dim:2 * key_dim], n_kq, d_k)
        )
        v = heads(mixed[2 * key_dim:], n_v, d_v)
        matrix = jnp.where(new, 0, matrices[src])[None].astype(jnp.float32)
        out, matrix = delta_rule._recurrent_gated_delta_rule_step(
            q, k, v, decay_t[None, :, None], beta_t[None, :, None], matrix
        )
        matrices = matrices.at[dst].set(matrix[0].astype(matrices.dtype))
        return (convs, matrices), out.reshape(-1).astype(x.dtype)

    (conv_state, recurrent_state), out = jax.lax.scan(
        step,
        (conv_state, recurrent_state),
        (mixed_qkv, beta, decay, read, write, fresh),
    )
    out = jnp.where(valid[:, None], out, 0).astype(mixed_qkv.dtype)
    return (conv_state, recurrent_state), out
