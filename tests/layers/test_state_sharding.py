"""The per-shard `[Q | K | V]` channel order of gated-delta-rule layers.

tpu-inference's GDN op hands each device a contiguous slice of the mixed
projection's channels and reads it as that device's `[Q_i | K_i | V_i]`;
the engine test (`tests/serve/test_tensor_parallel.py`, `qwen3_5-tp2`)
shows the served tokens, these the order itself.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from keras_vllm.errors import ServingError
from keras_vllm.layers.common import state_sharding


def _labels(key_heads, key_dim, value_heads, value_dim):
    """Each channel of `[Q | K | V]` as `(part, head)`."""
    return (
        [("q", h) for h in range(key_heads) for _ in range(key_dim)]
        + [("k", h) for h in range(key_heads) for _ in range(key_dim)]
        + [("v", h) for h in range(value_heads) for _ in range(value_dim)]
    )


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_each_shard_holds_its_own_heads(shards):
    key_heads, key_dim, value_heads, value_dim = 4, 3, 8, 2
    order = state_sharding.per_shard_order(
        key_heads, key_dim, value_heads, value_dim, shards
    )
    labels = _labels(key_heads, key_dim, value_heads, value_dim)
    assert sorted(order.tolist()) == list(range(len(labels)))
    slices = np.split(np.asarray(order), shards)
    for i, part in enumerate(slices):
        got = [labels[c] for c in part]
        k_per, v_per = key_heads // shards, value_heads // shards
        want = _labels(k_per, key_dim, v_per, value_dim)
        # The shard's heads, renumbered from its first.
        got = [(p, h - i * (k_per if p != "v" else v_per)) for p, h in got]
        assert got == want
    if shards == 1:
        assert order.tolist() == list(range(len(labels)))


def test_heads_that_do_not_divide_are_refused_by_name():
    state_sharding.check_heads_split(2, 4, 2)
    with pytest.raises(ServingError, match="2 key heads and 4 value heads"):
        state_sharding.check_heads_split(2, 4, 4)


# tpu-inference's op on 2 CPU devices against 1, in a fresh interpreter (the
# device count is fixed when JAX starts): with the channels reordered the
# two agree; without, each device reads another's query/key channels.
_TWO_DEVICES = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
import numpy as np
from tpu_inference.layers.common.gdn_attention import run_jax_gdn_attention
from keras_vllm.layers.common.gated_delta_rule import conv1d_gdn
from keras_vllm.layers.common.state_sharding import per_shard_order

nk, nv, dk, dv, kernel, tokens = 2, 4, 8, 8, 4, 7
channels = 2 * nk * dk + nv * dv
rng = np.random.default_rng(0)
qkv = rng.normal(size=(tokens, channels)).astype("float32")
weight = (0.3 * rng.normal(size=(channels, 1, kernel))).astype("float32")
b, a = (rng.normal(size=(tokens, nv)).astype("float32") for _ in "ba")
A_log, dt_bias = (rng.normal(size=(nv,)).astype("float32") for _ in "Ad")
conv = np.zeros((4, kernel - 1, channels), "float32")
state = np.zeros((4, nv, dk, dv), "float32")
# One 7-token prefill in state slot 1.
starts = np.array([0, 7, 7, 7, 7], "int32")
slots = np.array([1, 0, 0, 0], "int32")
distribution = np.array([0, 1, 1], "int32")
seq_lens = np.array([7, 0, 0, 0], "int32")


def run(devices, order=None):
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:devices]).reshape(1, devices),
        ("data", "model"),
    )
    x, w = (qkv, weight) if order is None else (qkv[:, order], weight[order])
    _, out = run_jax_gdn_attention(
        x, b, a, conv, state, w, None, A_log, dt_bias, slots, starts,
        distribution, seq_lens, n_kq=nk, n_v=nv, d_k=dk, d_v=dv,
        kernel_size=kernel, mesh=mesh, conv1d_gdn_kernel=conv1d_gdn,
    )
    return np.asarray(out)


one = run(1)
print(np.abs(run(2, per_shard_order(nk, dk, nv, dv, 2)) - one).max())
print(np.abs(run(2) - one).max())
"""


@pytest.mark.serving
def test_reordered_channels_split_the_op_exactly():
    pytest.importorskip("tpu_inference")
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    result = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICES], env=env, capture_output=True,
        text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    reordered, as_is = (float(v) for v in result.stdout.split()[-2:])
    assert reordered < 1e-5
    assert as_is > 1e-2
