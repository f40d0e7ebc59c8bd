"""The shared ALiBi paged attention equals dense ALiBi attention.

`keras_vllm.layers.common.alibi_attention` serves families whose attention adds an
ALiBi bias (tpu-inference's kernels have none) through the pure-JAX
`keras_vllm.kernels.ragged_paged_attention` with `alibi_slopes`. These tests
run it, jitted, on random ragged batches in tpu-inference's cache layouts
(decodes, a prefill and a chunked-prefill continuation, random page tables,
padding tokens, GQA, head dims 16/64/80) and compare it with a dense,
per-sequence NumPy reference built from the sequences' whole K/V, and the
updated cache with the RPA reference kernel's. The kernel's ALiBi, sliding
window and soft cap options are also checked against that reference, alone
and together. The slopes must also be KerasHub's own.
"""

import functools
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
from tpu_inference.kernels.ragged_paged_attention.v3 import \
    kernel_hd64 as rpa_hd64  # noqa: E402

from keras_vllm import kernels  # noqa: E402
from keras_vllm.layers.common import alibi_attention  # noqa: E402

PAGE_SIZE = 8
PAGES_PER_SEQ = 6
MAX_NUM_SEQS = 6
# (q_len, kv_len): two decodes, a prefill, a chunked-prefill continuation.
SEQS = [(1, 9), (1, 30), (13, 13), (7, 30)]


def _batch(rng, hq, hkv, head_dim, pad_tokens=5):
    """Random ragged inputs, plus each sequence's full K/V history."""
    cache_head_dim = 64 if head_dim == 64 else -(-head_dim // 128) * 128
    shape_fn = (rpa_hd64.get_kv_cache_shape if head_dim == 64 else
                rpa_kernel.get_kv_cache_shape)
    num_pages = MAX_NUM_SEQS * PAGES_PER_SEQ + 3
    cache_shape = shape_fn(num_pages, PAGE_SIZE, hkv, cache_head_dim,
                           jnp.float32)
    total = sum(q for q, _ in SEQS)
    num_tokens = total + pad_tokens
    kv_lens = np.zeros(MAX_NUM_SEQS, np.int32)
    kv_lens[:len(SEQS)] = [kv for _, kv in SEQS]
    cu_q_lens = np.full(MAX_NUM_SEQS + 1, total, np.int32)
    cu_q_lens[0] = 0
    cu_q_lens[1:len(SEQS) + 1] = np.cumsum([q for q, _ in SEQS])
    page_indices = rng.permutation(num_pages)[:MAX_NUM_SEQS *
                                              PAGES_PER_SEQ].astype(np.int32)
    distribution = np.array([2, 3, len(SEQS)], np.int32)
    # Each sequence's whole history; its last q_len tokens are this step's.
    hist_k = [rng.standard_normal((kv, hkv, head_dim)) for _, kv in SEQS]
    hist_v = [rng.standard_normal((kv, hkv, head_dim)) for _, kv in SEQS]
    queries = rng.standard_normal((num_tokens, hq, head_dim))
    keys = rng.standard_normal((num_tokens, hkv, head_dim))
    values = rng.standard_normal((num_tokens, hkv, head_dim))
    for i, (q_len, kv_len) in enumerate(SEQS):
        rows = slice(cu_q_lens[i], cu_q_lens[i + 1])
        keys[rows] = hist_k[i][kv_len - q_len:]
        values[rows] = hist_v[i][kv_len - q_len:]
    # The cache holds the earlier history (and garbage elsewhere): write
    # it with the reference kernel's own cache update on a prefix batch.
    cache = rng.standard_normal(cache_shape)
    pad = [(0, 0), (0, 0), (0, cache_head_dim - head_dim)]
    for i, (q_len, kv_len) in enumerate(SEQS):
        past = kv_len - q_len
        if past == 0:
            continue
        lens = np.zeros(MAX_NUM_SEQS, np.int32)
        lens[0] = past
        cu = np.full(MAX_NUM_SEQS + 1, past, np.int32)
        cu[0] = 0
        table = np.roll(page_indices, -i * PAGES_PER_SEQ)
        k = jnp.asarray(np.pad(hist_k[i][:past], pad), jnp.float32)
        v = jnp.asarray(np.pad(hist_v[i][:past], pad), jnp.float32)
        _, cache = (rpa_hd64.ref_ragged_paged_attention_hd64
                    if head_dim == 64 else
                    rpa_kernel.ref_ragged_paged_attention)(
                        jnp.zeros((past, hkv, cache_head_dim), jnp.float32),
                        k, v,
                        jnp.asarray(cache, jnp.float32), lens, table, cu,
                        np.array([0, 1, 1], np.int32))
    args = (queries, keys, values, cache, kv_lens, page_indices, cu_q_lens,
            distribution)
    return args, hist_k, hist_v, total


def _dense_alibi(args, hist_k, hist_v, slopes, sm_scale, window=None,
                 soft_cap=None):
    """Dense attention per sequence; `slopes=None` means no ALiBi bias."""
    queries, cu_q_lens = args[0], args[6]
    hq = queries.shape[1]
    out = np.zeros_like(queries)
    for i, (q_len, kv_len) in enumerate(SEQS):
        group = hq // hist_k[i].shape[1]
        k = np.repeat(hist_k[i], group, axis=1)  # [kv, hq, d]
        v = np.repeat(hist_v[i], group, axis=1)
        q = queries[cu_q_lens[i]:cu_q_lens[i + 1]]  # [q, hq, d]
        q_pos = np.arange(kv_len - q_len, kv_len)
        k_pos = np.arange(kv_len)
        s = np.einsum("qhd,khd->hqk", q, k) * sm_scale
        if soft_cap is not None:
            s = soft_cap * np.tanh(s / soft_cap)
        if slopes is not None:
            s = s + slopes[:, None, None] * (k_pos[None, :] - q_pos[:, None])
        visible = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
            visible &= q_pos[:, None] - k_pos[None, :] < window
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[cu_q_lens[i]:cu_q_lens[i + 1]] = np.einsum("hqk,khd->qhd", p, v)
    return out


def _metadata(args):
    from tpu_inference.layers.common.attention_metadata import \
        AttentionMetadata
    (_, _, _, _, kv_lens, page_indices, cu_q_lens, distribution) = args
    return AttentionMetadata(
        input_positions=jnp.zeros((args[0].shape[0], ), jnp.int32),
        block_tables=jnp.asarray(page_indices),
        seq_lens=jnp.asarray(kv_lens),
        query_start_loc=jnp.asarray(cu_q_lens),
        request_distribution=jnp.asarray(distribution),
    )


@pytest.mark.parametrize("hq,hkv,head_dim", [(4, 4, 16), (8, 2, 64),
                                             (6, 6, 80)])
def test_matches_dense_alibi(hq, hkv, head_dim):
    rng = np.random.default_rng(hq * 100 + head_dim)
    args, hist_k, hist_v, total = _batch(rng, hq, hkv, head_dim)
    slopes = np.asarray(alibi_attention.alibi_slopes(hq), np.float32)
    sm_scale = 0.9 * head_dim**-0.5
    want = _dense_alibi(args, hist_k, hist_v, slopes, sm_scale)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    q, k, v, cache = (jnp.asarray(a, jnp.float32) for a in args[:4])

    @jax.jit
    def step(cache, q, k, v, md):
        return alibi_attention.paged_alibi_attention(
            cache, q, k, v, md, sm_scale=sm_scale,
            alibi_slopes=slopes.tolist(), mesh=mesh)

    new_cache, out = step(cache, q, k, v, _metadata(args))
    assert out.shape == q.shape
    np.testing.assert_allclose(out[:total], want[:total], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(out[total:], 0.0)
    # The cache update is the RPA kernels' (same layout, same rows).
    pad = [(0, 0), (0, 0), (0, cache.shape[-1] - head_dim)
           ] if head_dim != 64 else [(0, 0)] * 3
    ref_fn = (rpa_hd64.ref_ragged_paged_attention_hd64
              if head_dim == 64 else rpa_kernel.ref_ragged_paged_attention)
    _, ref_cache = ref_fn(jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad),
                          cache, *args[4:])
    np.testing.assert_array_equal(new_cache, ref_cache)


def test_loops_over_live_tokens_only():
    rng = np.random.default_rng(0)
    args, _, _, _ = _batch(rng, 4, 4, 16)
    slopes = jnp.ones((4, ), jnp.float32)
    hlo = jax.jit(
        lambda *a: kernels.ragged_paged_attention(
            *a, sm_scale=0.25, alibi_slopes=slopes)).lower(
                *(jnp.asarray(x) for x in args)).as_text()
    assert hlo.count("stablehlo.while") >= 3


@pytest.mark.parametrize("head_dim,alibi,window,soft_cap", [
    (16, False, 5, None),
    (16, False, None, 3.0),
    (16, True, 5, None),
    (16, True, None, 3.0),
    (16, True, 9, 3.0),
    (64, True, 9, 3.0),
])
def test_kernel_options_match_dense(head_dim, alibi, window, soft_cap):
    # The one kernel's options, alone and together, on the same ragged batch
    # (windows cross page boundaries; cap 3.0 is tight enough
    # to change the result).
    hq, hkv = 4, 2
    rng = np.random.default_rng(head_dim)
    args, hist_k, hist_v, total = _batch(rng, hq, hkv, head_dim)
    slopes = (np.asarray(alibi_attention.alibi_slopes(hq), np.float32)
              if alibi else None)
    sm_scale = head_dim**-0.5
    want = _dense_alibi(args, hist_k, hist_v, slopes, sm_scale,
                        window=window, soft_cap=soft_cap)
    kernel = jax.jit(functools.partial(
        kernels.ragged_paged_attention, sm_scale=sm_scale,
        sliding_window=window, soft_cap=soft_cap, hd64=head_dim == 64))
    out, _ = kernel(*(jnp.asarray(a, jnp.float32) for a in args[:4]),
                    *args[4:], alibi_slopes=slopes)
    np.testing.assert_allclose(out[:total], want[:total], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(out[total:], 0.0)
    # Each option changes the result (the reference would not notice an
    # option the kernel ignores if the option had no effect).
    plain = _dense_alibi(args, hist_k, hist_v, None, sm_scale)
    assert not np.allclose(want[:total], plain[:total], atol=1e-3)


@pytest.mark.parametrize("num_heads", [1, 4, 6, 12, 16])
def test_slopes_are_keras_hubs(num_heads):
    from keras_hub.src.layers.modeling.alibi_bias import AlibiBias
    from keras_hub.src.models.falcon.falcon_transformer_decoder import \
        FalconTransformerDecoder

    ours = alibi_attention.alibi_slopes(num_heads)
    assert ours == AlibiBias()._get_slopes(num_heads)
    falcon = FalconTransformerDecoder(num_attention_heads=num_heads,
                                      intermediate_dim=8)
    assert ours == falcon._get_slopes(num_heads)
