"""`attend_until` of the pure-JAX ragged paged attention: the tokens of an
image span see their whole span (Gemma 3's bidirectional attention within
an image), every other token stays causal.

Checked on a ragged batch (a decode and two prefills, spans crossing query
blocks) against a dense softmax over each prefill's keys with KerasHub's
mask (causal or same-span, and the symmetric sliding band), and the causal
tokens against tpu-inference's own reference kernel.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from tpu_inference.kernels.ragged_paged_attention.v3 import \
    kernel as rpa_kernel  # noqa: E402

from keras_vllm.kernels import ragged_paged_attention  # noqa: E402

PAGE_SIZE = 8
PAGES_PER_SEQ = 6
MAX_NUM_SEQS = 4
HQ, HKV, D = 4, 2, 32
# (q_len, kv_len): a decode, then two whole prefills.
SEQS = [(1, 9), (13, 13), (20, 20)]
# Image spans [start, end) in positions of the prefills (sequence index).
SPANS = {1: [(3, 7)], 2: [(2, 6), (9, 18)]}


def _batch(rng):
    num_pages = MAX_NUM_SEQS * PAGES_PER_SEQ + 3
    cache_shape = rpa_kernel.get_kv_cache_shape(
        num_pages, PAGE_SIZE, HKV, D, jnp.float32
    )
    total = sum(q for q, _ in SEQS)
    num_tokens = total + 3
    q = rng.standard_normal((num_tokens, HQ, D))
    k = rng.standard_normal((num_tokens, HKV, D))
    v = rng.standard_normal((num_tokens, HKV, D))
    cache = rng.standard_normal(cache_shape)
    kv_lens = np.zeros(MAX_NUM_SEQS, np.int32)
    kv_lens[: len(SEQS)] = [kv for _, kv in SEQS]
    cu = np.zeros(MAX_NUM_SEQS + 1, np.int32)
    cu[1: len(SEQS) + 1] = np.cumsum([q for q, _ in SEQS])
    cu[len(SEQS) + 1:] = total
    pages = rng.permutation(num_pages)[: MAX_NUM_SEQS * PAGES_PER_SEQ]
    distribution = np.array([1, 3, 3], np.int32)
    args = tuple(
        jnp.asarray(a) for a in (q, k, v, cache, kv_lens,
                                 pages.astype(np.int32), cu, distribution)
    )
    # Each token's last visible position: its own, or its span's last.
    until = np.zeros(num_tokens, np.int32)
    for seq, (q_len, kv_len) in enumerate(SEQS):
        start = cu[seq]
        for t in range(q_len):
            pos = kv_len - q_len + t
            until[start + t] = pos
            for lo, hi in SPANS.get(seq, ()):
                if lo <= pos < hi:
                    until[start + t] = hi - 1
    return args, until, total, cu


def _dense(q, k, v, until, window, scale):
    """KerasHub's masks for one whole prefill: causal OR same span, within
    the symmetric sliding band."""
    n = q.shape[0]
    pos = np.arange(n)
    mask = pos[None, :] <= until[:, None]
    if window is not None:
        mask &= np.abs(pos[:, None] - pos[None, :]) < window
    group = HQ // HKV
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) * scale
    s = np.where(mask[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v)


@pytest.mark.parametrize("window,q_block", [(None, 32), (None, 4), (6, 4)])
def test_image_spans_attend_to_their_whole_span(window, q_block):
    rng = np.random.default_rng(7)
    args, until, total, cu = _batch(rng)
    scale = D**-0.5
    fn = jax.jit(
        lambda *a, attend_until: ragged_paged_attention(
            *a, sm_scale=scale, sliding_window=window, q_block=q_block,
            attend_until=attend_until,
        )
    )
    out, cache = fn(*args, attend_until=jnp.asarray(until))
    causal, ref_cache = rpa_kernel.ref_ragged_paged_attention(
        *args, sm_scale=scale, sliding_window=window
    )
    np.testing.assert_array_equal(cache, ref_cache)
    out = np.asarray(out)
    q, k, v = (np.asarray(a) for a in args[:3])
    spans = 0
    for seq, (q_len, kv_len) in enumerate(SEQS):
        rows = slice(cu[seq], cu[seq] + q_len)
        if q_len == kv_len:
            want = _dense(q[rows], k[rows], v[rows], until[rows],
                          window, scale)
            np.testing.assert_allclose(out[rows], want, rtol=1e-5, atol=1e-5)
        for t in range(cu[seq], cu[seq] + q_len):
            pos = kv_len - q_len + (t - cu[seq])
            if until[t] == pos:
                np.testing.assert_allclose(
                    out[t], np.asarray(causal)[t], rtol=1e-5, atol=1e-5
                )
            else:
                spans += 1
                # A span token's output is not the causal one.
                assert np.abs(out[t] - np.asarray(causal)[t]).max() > 1e-3
    assert spans == 4 + 4 + 9 - 3  # every span token but each span's last
    np.testing.assert_array_equal(out[total:], 0.0)


def test_without_attend_until_nothing_changes():
    rng = np.random.default_rng(8)
    args, until, total, _ = _batch(rng)
    positions = np.asarray(until)  # spans present, but:
    own = np.zeros_like(positions)  # limits below each position: causal
    a, _ = ragged_paged_attention(*args, sm_scale=0.3)
    b, _ = ragged_paged_attention(*args, sm_scale=0.3,
                                  attend_until=jnp.asarray(own))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
