"""Which fused conv1d + gated delta rule kernel a linear-attention layer runs.

tpu-inference's GDN v3 Pallas kernel splits heads into the chip's 128-lane
columns, so a layer whose heads are narrower (the tiny Qwen 3.5 fixtures:
16) crashed inside it on a TPU (`ValueError: Need at least one array to
concatenate`). `gated_delta_rule.kernel_for` sends such layers to the
portable JAX kernel and keeps the Pallas one for the shapes it takes (every
Qwen 3.5 preset: 128). The TPU tier runs both shapes on the chip
(`tests/tpu/test_tpu_families.py`); here the choice itself, with the
backend faked, and the windowed kernel a speculating engine runs (a state
per draft position) against decoding one token a step. Cost: ~3 s.
"""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from keras_vllm.layers.common import gated_delta_rule


@pytest.fixture
def on_a_tpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(gated_delta_rule, "_tpu_lanes", lambda: 128)
    monkeypatch.setattr(gated_delta_rule, "_warned", set())


@pytest.mark.parametrize(
    "key_head_dim, value_head_dim", [(128, 128), (256, 128), (128, 256)]
)
def test_the_pallas_kernel_runs_the_head_sizes_it_takes(
    on_a_tpu, key_head_dim, value_head_dim
):
    assert gated_delta_rule.kernel_for(key_head_dim, value_head_dim) is None


@pytest.mark.parametrize(
    "key_head_dim, value_head_dim", [(16, 16), (64, 128), (128, 96), (192, 128)]
)
def test_other_head_sizes_run_the_portable_kernel_on_a_tpu(
    on_a_tpu, caplog, key_head_dim, value_head_dim
):
    with caplog.at_level(logging.WARNING, logger="keras_vllm"):
        kernel = gated_delta_rule.kernel_for(key_head_dim, value_head_dim)
        again = gated_delta_rule.kernel_for(key_head_dim, value_head_dim)
    assert kernel is again is gated_delta_rule.conv1d_gdn
    # Said once per head shape, naming the sizes and the reason.
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert f"{key_head_dim} (key) and {value_head_dim} (value)" in messages[0]
    assert "multiples of 128" in messages[0]


def test_cpu_devices_run_the_portable_kernel():
    assert jax.default_backend() == "cpu"
    for dims in [(16, 16), (128, 128)]:
        assert gated_delta_rule.kernel_for(*dims) is gated_delta_rule.conv1d_gdn


def test_a_speculating_engine_runs_the_windowed_kernel(on_a_tpu, caplog):
    """With a state window every backend and head size keeps a state per
    draft position; the Pallas kernel's refusal to, on a TPU, is logged."""
    with caplog.at_level(logging.WARNING, logger="keras_vllm"):
        for dims in [(16, 16), (128, 128)]:
            kernel = gated_delta_rule.kernel_for(*dims, state_window=5)
            assert kernel.func is gated_delta_rule.conv1d_gdn_windowed
            assert kernel.keywords == {"window": 5}
    messages = [r.getMessage() for r in caplog.records]
    assert any("roll rejected drafts back" in m for m in messages), messages


# The windowed kernel over a simulated engine (`_run`): 2 requests of random
# layer inputs, prefilled in chunks, then decoded one token a step or
# verified in windows with random acceptance. Small heads, f32.
_HEADS = dict(n_kq=2, n_v=4, d_k=8, d_v=8, kernel_size=4)
_MAX_REQUESTS, _PADDED_TOKENS, _LENGTH = 4, 16, 40


def _weights(rng):
    h = _HEADS
    dim = 2 * h["n_kq"] * h["d_k"] + h["n_v"] * h["d_v"]
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa
    return dim, {
        "conv_weight": f32(dim, 1, h["kernel_size"]) * 0.5,
        "conv_bias": f32(dim) * 0.1,
        "A_log": f32(h["n_v"]),
        "dt_bias": f32(h["n_v"]),
    }


def _run(kernel, window, steps, weights, dim):
    """Runs `steps` (each a list of `(request, start, (x, b, a))`) through
    `kernel` as the engine would, with `window` slots a request (the
    windowed kernel) or one (`window` None: `conv1d_gdn`); returns each
    step's `{request: out}`."""
    extra = {} if window is None else {"window": window}
    window = window or 1
    # Every step padded to one shape: one compilation a kernel.
    kernel = jax.jit(functools.partial(kernel, **_HEADS, **extra))
    h = _HEADS
    slots = _MAX_REQUESTS * window + 1
    conv = jnp.zeros((slots, h["kernel_size"] - 1, dim), jnp.float32)
    matrices = jnp.zeros((slots, h["n_v"], h["d_k"], h["d_v"]), jnp.float32)
    results = []
    for batch in steps:
        starts, lengths, bases = [0], [], []
        for request, start, (x, _, _) in batch:
            starts.append(starts[-1] + len(x))
            lengths.append(start + len(x))
            bases.append(1 + request * window)  # the runner's slot groups
        rest = _MAX_REQUESTS - len(batch)
        tokens = starts[-1]

        def flat(i):
            parts = np.concatenate([inputs[i] for _, _, inputs in batch])
            return jnp.asarray(
                np.pad(parts, ((0, _PADDED_TOKENS - tokens), (0, 0)))
            )

        decodes = len(batch) if all(
            len(inputs[0]) == 1 for _, _, inputs in batch
        ) else 0
        bases = jnp.asarray(bases + [0] * rest, jnp.int32)
        (conv, matrices), out = kernel(
            flat(0), flat(1), flat(2), conv, matrices,
            weights["conv_weight"], weights["conv_bias"], weights["A_log"],
            weights["dt_bias"],
            jnp.asarray(starts + [tokens] * rest, jnp.int32), bases,
            jnp.asarray([decodes, decodes, len(batch)], jnp.int32),
            jnp.asarray(lengths + [0] * rest, jnp.int32), bases,
        )
        out = np.asarray(out)
        results.append({
            request: out[starts[i]:starts[i + 1]]
            for i, (request, _, _) in enumerate(batch)
        })
    return results


def _prefills(data):
    # Request 0 in two chunks (state carried over), request 1 in one.
    def part(r, lo, hi):
        return tuple(t[lo:hi] for t in data[r])

    return part, [
        [(0, 0, part(0, 0, 6)), (1, 0, part(1, 0, 7))],
        [(0, 6, part(0, 6, 10))],
    ], {0: 10, 1: 7}


def test_verify_windows_equal_decoding_one_token_a_step():
    """Accepted positions of verify windows (random drafts, random
    acceptance, rejected drafts random inputs) get exactly what one token a
    step gives; one token a step with the windowed kernel at window 1 is
    today's `conv1d_gdn` up to rounding. Cost: ~3 s."""
    rng = np.random.default_rng(0)
    dim, weights = _weights(rng)
    data = {r: tuple(
        rng.normal(size=(_LENGTH, n)).astype(np.float32)
        for n in (dim, _HEADS["n_v"], _HEADS["n_v"])
    ) for r in (0, 1)}
    part, plain, position = _prefills(data)
    while max(position.values()) < _LENGTH:
        batch = [(r, p, part(r, p, p + 1)) for r, p in position.items()
                 if p < _LENGTH]
        plain.append(batch)
        for r, _, _ in batch:
            position[r] += 1
    windowed = gated_delta_rule.conv1d_gdn_windowed
    today = _run(gated_delta_rule.conv1d_gdn, None, plain, weights, dim)
    one_slot = _run(windowed, 1, plain, weights, dim)
    decoded = {}
    for r in (0, 1):
        decoded[r] = np.concatenate([s[r] for s in one_slot if r in s])
        expected = np.concatenate([s[r] for s in today if r in s])
        np.testing.assert_allclose(decoded[r], expected, atol=1e-6, rtol=0)

    window = 5  # 4 drafted tokens
    _, steps, position = _prefills(data)
    plans, accepted = [], []
    fixed = [(4, 4), (4, 0), (3, 3), (4, 1), (2, 2), (4, 3), (1, 0), (4, 2)]
    while min(position.values()) < _LENGTH - window:
        batch, plan = [], {}
        for r, p in position.items():
            if p >= _LENGTH - window:
                continue
            # (drafted, accepted): every count of accepted drafts first,
            # then at random.
            if fixed:
                drafts, right = fixed.pop()
            else:
                drafts = int(rng.integers(0, window))
                right = int(rng.integers(0, drafts + 1))
            inputs = tuple(t.copy() for t in part(r, p, p + 1 + drafts))
            for t in inputs:  # the rejected drafts: other tokens' inputs
                t[1 + right:] = rng.normal(size=t[1 + right:].shape)
            batch.append((r, p, inputs))
            plan[r] = (p, right)
            accepted.append(right)
        steps.append(batch)
        plans.append(plan)
        for r, (p, right) in plan.items():
            position[r] = p + 1 + right
    verified = _run(windowed, window, steps, weights, dim)
    for step, expected in zip(verified[:2], one_slot[:2]):
        for r in step:
            np.testing.assert_array_equal(step[r], expected[r])
    for step, plan in zip(verified[2:], plans):
        for r, (p, right) in plan.items():
            np.testing.assert_array_equal(
                step[r][: 1 + right], decoded[r][p:p + 1 + right]
            )
    # Every number of accepted drafts happened, none and all included.
    assert set(accepted) == set(range(window)), accepted
