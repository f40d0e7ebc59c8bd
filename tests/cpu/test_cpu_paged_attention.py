"""The CPU ragged paged attention equals tpu-inference's reference kernels.

`keras_vllm.cpu.ragged_paged_attention` (tpu-inference's kernel signatures over
the pure-JAX `keras_vllm.kernels.ragged_paged_attention`) replaces
tpu-inference 0.32.0's RPA v3 Pallas kernels on JAX CPU devices. These tests
compare it with the package's
own (eager, non-jittable) references `ref_ragged_paged_attention` and
`ref_ragged_paged_attention_hd64` on random ragged batches: decode-only,
prefill and mixed sequences, random page tables, GQA, head dims 16/32/64/128,
sliding windows and soft caps. Outputs must agree to ~1e-5 and the updated
caches exactly. They also check the shared `paged_attention` layer function,
which goes through tpu-inference's real attention interface (on CPU that
lands on the patched kernel).
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
from keras_vllm.cpu import ragged_paged_attention as cpu_rpa  # noqa: E402

PAGE_SIZE = 8
PAGES_PER_SEQ = 6  # max context 48 tokens
MAX_NUM_SEQS = 6


def _make_batch(rng, seqs, num_q_heads, num_kv_heads, head_dim, *,
                dtype=jnp.float32, pad_tokens=5):
    """Random inputs for `seqs` = [(q_len, kv_len), ...], decodes first.

    Returns the positional arguments of the RPA kernels and the number of
    real (non-padding) tokens.
    """
    hd64 = head_dim == 64
    shape_fn = rpa_hd64.get_kv_cache_shape if hd64 else (
        rpa_kernel.get_kv_cache_shape)
    num_pages = MAX_NUM_SEQS * PAGES_PER_SEQ + 3
    cache_shape = shape_fn(num_pages, PAGE_SIZE, num_kv_heads, head_dim,
                           dtype)
    q_lens = [q for q, _ in seqs]
    total = sum(q_lens)
    num_tokens = total + pad_tokens
    queries = rng.standard_normal((num_tokens, num_q_heads, head_dim))
    keys = rng.standard_normal((num_tokens, num_kv_heads, head_dim))
    values = rng.standard_normal((num_tokens, num_kv_heads, head_dim))
    kv_cache = rng.standard_normal(cache_shape)
    kv_lens = np.zeros(MAX_NUM_SEQS, np.int32)
    kv_lens[:len(seqs)] = [kv for _, kv in seqs]
    cu_q_lens = np.zeros(MAX_NUM_SEQS + 1, np.int32)
    cu_q_lens[1:len(seqs) + 1] = np.cumsum(q_lens)
    cu_q_lens[len(seqs) + 1:] = total
    # A random page table: every sequence owns distinct random pages; unused
    # slots hold arbitrary (but in-range) page ids, as vLLM's padding does.
    perm = rng.permutation(num_pages)[:MAX_NUM_SEQS * PAGES_PER_SEQ]
    page_indices = perm.astype(np.int32)
    num_decode = sum(1 for q, _ in seqs if q == 1)
    num_prefill = sum(1 for q, kv in seqs if q > 1 and q == kv)
    distribution = np.array(
        [num_decode, num_decode + num_prefill,
         len(seqs)], np.int32)
    as_dtype = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return (as_dtype(queries), as_dtype(keys), as_dtype(values),
            as_dtype(kv_cache), jnp.asarray(kv_lens),
            jnp.asarray(page_indices), jnp.asarray(cu_q_lens),
            jnp.asarray(distribution)), total


def _reference(args, head_dim, **kwargs):
    if head_dim == 64:
        return rpa_hd64.ref_ragged_paged_attention_hd64(*args, **kwargs)
    return rpa_kernel.ref_ragged_paged_attention(*args, **kwargs)


def _ours(args, head_dim, jit=False, **kwargs):
    fn = (cpu_rpa.ragged_paged_attention_hd64
          if head_dim == 64 else cpu_rpa.ragged_paged_attention)
    if jit:
        fn = jax.jit(fn, static_argnames=tuple(kwargs))
    return fn(*args, **kwargs)


# (q_len, kv_len) per sequence: decodes first, then a prefill (q == kv), then a
# chunked-prefill continuation (q < kv). Sizes cross page and Q/KV block
# boundaries. The eager reference compiles one op per new shape, so the cases
# below reuse these sequences to keep the module fast.
BATCHES = {
    "mixed": [(1, 9), (1, 30), (13, 13), (7, 30)],
    "decode": [(1, 9), (1, 30), (1, 1)],
    "prefill": [(13, 13), (1, 1)],
}

CASES = [
    # (batch, num_q_heads, num_kv_heads, head_dim, sliding_window, soft_cap)
    ("mixed", 4, 2, 32, None, None),
    ("mixed", 4, 2, 32, 5, 20.0),
    ("mixed", 4, 2, 32, 1, None),
    ("decode", 4, 2, 32, None, 30.0),
    ("mixed", 4, 4, 16, None, None),
    ("prefill", 8, 2, 128, 7, None),
    ("mixed", 4, 2, 64, None, None),
    ("mixed", 4, 2, 64, 6, 25.0),
]


@pytest.mark.parametrize("batch,hq,hkv,head_dim,window,soft_cap", CASES)
def test_matches_reference(batch, hq, hkv, head_dim, window, soft_cap):
    rng = np.random.default_rng(head_dim * 100 + hq * 10 + hkv)
    args, total = _make_batch(rng, BATCHES[batch], hq, hkv, head_dim)
    kwargs = dict(sm_scale=head_dim**-0.5, sliding_window=window,
                  soft_cap=soft_cap)
    ref_out, ref_cache = _reference(args, head_dim, **kwargs)
    out, cache = _ours(args, head_dim, jit=True, **kwargs)
    assert out.shape == args[0].shape
    assert out.dtype == ref_out.dtype
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache, ref_cache)
    # Rows of padding tokens are zero, never garbage.
    np.testing.assert_array_equal(out[total:], 0.0)


def test_trip_counts_are_data_dependent():
    # Cost follows the live tokens: the jitted program loops (while) over the
    # live sequences, their query blocks and the KV blocks they can see; it
    # does not gather every token's whole context.
    rng = np.random.default_rng(0)
    args, _ = _make_batch(rng, BATCHES["mixed"], 4, 2, 32)
    hlo = jax.jit(kernels.ragged_paged_attention).lower(*args).as_text()
    assert hlo.count("stablehlo.while") >= 3


@pytest.mark.parametrize("batch,pad_tokens", [
    ("mixed", 5),     # one-row decodes, blocked prefills
    ("decode", 0),    # no padding rows past the last token
    ("prefill", 5),   # a one-token prompt (prefill class) takes one row
])
def test_block_sizes_do_not_change_results(batch, pad_tokens):
    # `q_block` and `single_query_block` only change how the work is
    # blocked; every setting must give the same result, with an attention
    # sink, ALiBi slopes, a window and a soft cap all on.
    rng = np.random.default_rng(7)
    args, total = _make_batch(rng, BATCHES[batch], 4, 2, 32,
                              pad_tokens=pad_tokens)
    sink = jnp.asarray(rng.standard_normal(4), jnp.float32)
    kwargs = dict(sm_scale=0.2, sliding_window=11, soft_cap=25.0,
                  alibi_slopes=[0.5, 0.25, 0.125, 0.0625])
    outs = []
    for q_block, single in [(8, 8), (1, 1), (32, 1), (3, 2)]:
        fn = jax.jit(functools.partial(
            kernels.ragged_paged_attention, q_block=q_block,
            single_query_block=single, **kwargs))
        out, cache = fn(*args, sink)
        np.testing.assert_array_equal(out[total:], 0.0)
        outs.append((np.asarray(out[:total]), np.asarray(cache)))
    for out, cache in outs[1:]:
        np.testing.assert_allclose(out, outs[0][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(cache, outs[0][1])
    # Without ALiBi and the sink (which tpu-inference's default-layout
    # reference lacks), the default setting also equals the reference.
    del kwargs["alibi_slopes"]
    ref_out, _ = rpa_kernel.ref_ragged_paged_attention(*args, **kwargs)
    out, _ = jax.jit(functools.partial(kernels.ragged_paged_attention,
                                       **kwargs))(*args)
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)


def test_tpu_tuning_knobs_are_ignored():
    # tpu-inference passes Pallas block sizes and vmem limits by keyword; the
    # adapter must accept them and give the same result as without them.
    rng = np.random.default_rng(4)
    args, total = _make_batch(rng, BATCHES["decode"], 4, 2, 32)
    want, _ = cpu_rpa.ragged_paged_attention(*args, sm_scale=0.3)
    got, _ = cpu_rpa.ragged_paged_attention(
        *args, sm_scale=0.3, mask_value=-1e9, chunk_prefill_size=256,
        d_block_sizes=(8, 64, 8, 64), vmem_limit_bytes=1 << 20)
    np.testing.assert_array_equal(got, want)


def test_attention_sink_hd64():
    rng = np.random.default_rng(1)
    args, total = _make_batch(rng, BATCHES["mixed"], 4, 2, 64)
    sink = jnp.asarray(rng.standard_normal(4), jnp.float32)
    ref_out, ref_cache = rpa_hd64.ref_ragged_paged_attention_hd64(
        *args, sink, sm_scale=0.125)
    out, cache = jax.jit(cpu_rpa.ragged_paged_attention_hd64)(
        *args, sink, sm_scale=0.125)
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache, ref_cache)


def test_bfloat16_cache_packing():
    # bf16 packs two cache rows per 32-bit word: cache dim 2 is halved.
    rng = np.random.default_rng(2)
    args, total = _make_batch(rng, BATCHES["mixed"], 4, 2, 32,
                              dtype=jnp.bfloat16)
    assert args[3].shape[2:4] == (2, 2)
    kwargs = dict(sm_scale=32**-0.5)
    ref_out, ref_cache = _reference(args, 32, **kwargs)
    out, cache = _ours(args, 32, jit=True, **kwargs)
    np.testing.assert_array_equal(cache, ref_cache)
    np.testing.assert_allclose(np.asarray(out[:total], np.float32),
                               np.asarray(ref_out, np.float32),
                               rtol=2e-2, atol=2e-2)


def test_no_causal_mask_sees_whole_sequence():
    rng = np.random.default_rng(3)
    args, total = _make_batch(rng, BATCHES["mixed"], 4, 2, 32)
    kwargs = dict(sm_scale=0.2, use_causal_mask=False)
    ref_out, ref_cache = _reference(args, 32, **kwargs)
    out, cache = _ours(args, 32, jit=True, **kwargs)
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache, ref_cache)


# ---------------------------------------------------------------------------
# The shared layer function, through tpu-inference's attention interface.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def patched():
    from keras_vllm.cpu import apply_patches
    apply_patches()


def _metadata(args):
    from tpu_inference.layers.common.attention_metadata import \
        AttentionMetadata
    (_, _, _, _, kv_lens, page_indices, cu_q_lens, distribution) = args
    num_tokens = args[0].shape[0]
    return AttentionMetadata(
        input_positions=jnp.zeros((num_tokens, ), jnp.int32),
        block_tables=page_indices,
        seq_lens=kv_lens,
        query_start_loc=cu_q_lens,
        request_distribution=distribution,
    )


@pytest.mark.parametrize("head_dim,window,soft_cap", [
    (32, None, None),
    (64, 5, None),
    (80, None, 15.0),
    (128, 9, 30.0),
])
def test_shared_paged_attention_matches_reference(patched, head_dim, window,
                                                  soft_cap):
    from keras_vllm.layers.common.paged_attention import paged_attention
    from tpu_inference.utils import get_padded_head_dim

    rng = np.random.default_rng(head_dim)
    hq, hkv = 4, 2
    args, total = _make_batch(rng, BATCHES["mixed"], hq, hkv, head_dim)
    q, k, v, kv_cache = args[:4]
    # The cache tpu-inference allocates is laid out for the padded head dim.
    padded = get_padded_head_dim(head_dim)
    assert kv_cache.shape[-1] == (128 if head_dim == 64 else padded)
    kwargs = dict(sm_scale=0.7 * head_dim**-0.5, sliding_window=window,
                  soft_cap=soft_cap)
    ref_out, ref_cache = _reference(args, head_dim, **kwargs)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))

    @jax.jit
    def step(kv_cache, q, k, v, md):
        return paged_attention(kv_cache, q, k, v, md, mesh=mesh, **kwargs)

    new_cache, out = step(kv_cache, q, k, v, _metadata(args))
    assert out.shape == q.shape
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_cache, ref_cache)


def test_shared_paged_attention_default_mesh(patched):
    from keras_vllm.layers.common.paged_attention import paged_attention

    rng = np.random.default_rng(7)
    args, total = _make_batch(rng, BATCHES["decode"], 4, 2, 32)
    ref_out, ref_cache = _reference(args, 32, sm_scale=0.25)
    new_cache, out = jax.jit(
        lambda c, q, k, v, md: paged_attention(c, q, k, v, md, sm_scale=0.25)
    )(args[3], *args[:3], _metadata(args))
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_cache, ref_cache)


def test_shared_paged_attention_takes_sinks(patched):
    """`paged_attention(sinks=...)` reaches the head_dim 64 kernel through
    tpu-inference's interface (as its reference computes them, with a
    window); other head dims are refused by name, as tpu-inference does."""
    from keras_vllm.layers.common.paged_attention import paged_attention

    rng = np.random.default_rng(64)
    args, total = _make_batch(rng, BATCHES["mixed"], 4, 2, 64)
    sinks = jnp.asarray(rng.standard_normal(4), jnp.float32)
    ref_out, ref_cache = rpa_hd64.ref_ragged_paged_attention_hd64(
        *args, sinks, sm_scale=0.125, sliding_window=6)
    no_sink, _ = rpa_hd64.ref_ragged_paged_attention_hd64(
        *args, sm_scale=0.125, sliding_window=6)
    assert np.abs(np.asarray(ref_out - no_sink)).max() > 1e-3
    q, k, v, kv_cache = args[:4]
    new_cache, out = jax.jit(
        lambda c, q, k, v, md, s: paged_attention(
            c, q, k, v, md, sm_scale=0.125, sliding_window=6, sinks=s)
    )(kv_cache, q, k, v, _metadata(args), sinks)
    np.testing.assert_allclose(out[:total], ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(new_cache, ref_cache)

    args, _ = _make_batch(rng, BATCHES["decode"], 4, 2, 32)
    with pytest.raises(NotImplementedError, match="sinks need head_dim 64"):
        paged_attention(args[3], *args[:3], _metadata(args), sm_scale=0.25,
                        sinks=sinks)
