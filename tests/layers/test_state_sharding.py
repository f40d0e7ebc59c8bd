"""The per-shard `[Q | K | V]` channel order of gated-delta-rule layers.

tpu-inference's GDN op hands each device a contiguous slice of the mixed
projection's channels and reads it as that device's `[Q_i | K_i | V_i]`;
the engine test (`tests/serve/test_tensor_parallel.py`, `qwen3_5-tp2`)
shows the served tokens, these the order itself.
"""

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
