"""Qwen 3.5's paged layers over vLLM's flat batch, without an engine.

The whole tiny backbone (3 Gated DeltaNet layers, 1 gated full-attention
layer) runs several serving steps in the layout tpu-inference's runner
hands the model: ragged token batches mixing decodes, whole prefills and
chunked-prefill continuations, padding tokens, per-request recurrent-state
slots (`mamba_state_indices`, slots holding stale state from earlier
requests) and a paged KV cache. Every real token's output must equal the
Keras backbone's forward pass over that sequence. Also: KerasHub's cached
`generate()` path is not that forward pass (the reason this family's
reference is greedy decoding by the forward pass).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from keras import ops  # noqa: E402

from keras_vllm import testing  # noqa: E402
from keras_vllm.layers import swap  # noqa: E402
from keras_vllm.layers.common.context import ServingContext  # noqa: E402
from keras_vllm.layers.common.context import serving_context  # noqa: E402

PAGE_SIZE = 8
PAGES_PER_SEQ = 4
MAX_REQS = 4
# Full lengths of the three sequences, and each step's scheduled
# `(sequence, start, end)` spans: decodes first, then prefills, as vLLM
# orders a step's requests. Step 1: a whole prefill and the first chunk
# of another; step 2: a decode, the chunk's continuation, a new prefill;
# steps 3-4: decodes.
LENGTHS = (10, 13, 8)
STEPS = [
    [(0, 0, 7), (1, 0, 5)],
    [(0, 7, 8), (1, 5, 13), (2, 0, 6)],
    [(0, 8, 9), (2, 6, 7)],
    [(0, 9, 10), (2, 7, 8)],
]
DECODES = [0, 1, 2, 2]
# Each sequence's state slot (0 is vLLM's null slot) and KV pages.
SLOTS = (3, 1, 2)
PAD_TOKENS = 3
TOKENS = 24


def _backbone():
    config = testing.backbone_config("qwen3_5")
    backbone = testing.backbone_class("qwen3_5")(
        **config, vocabulary_size=64
    )
    rng = np.random.default_rng(0)
    # Non-trivial decays and biases (the initializers give zeros and ones).
    for layer in backbone.transformer_layers:
        if layer.layer_type == "linear_attention":
            gdn = layer._linear_attn
            gdn.A_log.assign(rng.uniform(-1, 0.5, gdn.A_log.shape))
            gdn.dt_bias.assign(rng.uniform(-0.5, 1, gdn.dt_bias.shape))
    return backbone


@pytest.fixture(scope="module")
def patched():
    from keras_vllm.cpu import apply_patches

    apply_patches()


def _metadata(step, positions, page_table):
    from tpu_inference.layers.common.attention_metadata import \
        AttentionMetadata

    total = sum(end - start for _, start, end in step)
    starts = np.full(MAX_REQS + 1, total, np.int32)
    starts[0] = 0
    starts[1 : len(step) + 1] = np.cumsum([e - s for _, s, e in step])
    seq_lens = np.zeros(MAX_REQS, np.int32)
    seq_lens[: len(step)] = [end for _, _, end in step]
    slots = np.zeros(MAX_REQS, np.int32)
    slots[: len(step)] = [SLOTS[seq] for seq, _, _ in step]
    tables = np.zeros((MAX_REQS, PAGES_PER_SEQ), np.int32)
    for i, (seq, _, _) in enumerate(step):
        tables[i] = page_table[seq]
    decodes = sum(1 for _, s, e in step if e - s == 1 and s > 0)
    return AttentionMetadata(
        input_positions=jnp.asarray(positions),
        block_tables=jnp.asarray(tables.reshape(-1)),
        seq_lens=jnp.asarray(seq_lens),
        query_start_loc=jnp.asarray(starts),
        request_distribution=jnp.asarray(
            [decodes, len(step), len(step)], jnp.int32
        ),
        mamba_state_indices=jnp.asarray(slots),
    )


def _caches(backbone, rng):
    from tpu_inference.kernels.ragged_paged_attention.v3 import kernel

    caches = []
    for layer in swap.find_attention_layers(backbone):
        if getattr(layer, "_has_recurrent_state", False):
            spec = layer.state_spec()
            # Stale state in every slot: new prefills must not read it.
            caches.append(tuple(
                jnp.asarray(rng.standard_normal((MAX_REQS + 1, *shape)),
                            dtype)
                for shape, dtype in zip(spec.shapes, spec.dtypes)
            ))
        else:
            spec = layer.kv_cache_spec()
            shape = kernel.get_kv_cache_shape(
                MAX_REQS * PAGES_PER_SEQ + 1, PAGE_SIZE, spec.num_kv_heads,
                128, jnp.float32,
            )
            caches.append(jnp.zeros(shape, jnp.float32))
    return caches


def test_serving_steps_match_the_forward_pass(patched):
    backbone = _backbone()
    rng = np.random.default_rng(1)
    sequences = [rng.integers(0, 64, n).astype("int32") for n in LENGTHS]
    # One right-padded batch: causal layers keep padding out of the real
    # positions' outputs.
    batch = np.zeros((len(LENGTHS), max(LENGTHS)), "int32")
    mask = np.zeros_like(batch)
    for i, seq in enumerate(sequences):
        batch[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
    want = ops.convert_to_numpy(
        backbone({"token_ids": batch, "padding_mask": mask})
    )
    specs = [
        getattr(swap.paged_class_for(layer), "_has_recurrent_state", False)
        for layer in swap.find_attention_layers(backbone)
    ]
    assert specs == [True, True, True, False]
    assert not swap.prefix_cacheable(backbone)
    assert swap.golden_reference(backbone) == "forward_pass"
    swap.swap_in_paged_layers(backbone)
    caches = _caches(backbone, rng)
    pages = rng.permutation(MAX_REQS * PAGES_PER_SEQ) + 1
    page_table = pages.reshape(MAX_REQS, PAGES_PER_SEQ)

    @jax.jit
    def run(caches, ids, metadata):
        context = ServingContext(caches, metadata, metadata.input_positions)
        with serving_context(context):
            hidden = backbone({
                "token_ids": ids[:, None],
                "padding_mask": jnp.ones((ids.shape[0], 1), "int32"),
            })
        context.check_all_used_once()
        return hidden, context.kv_caches

    for step, decodes in zip(STEPS, DECODES):
        ids = np.concatenate([sequences[q][s:e] for q, s, e in step])
        positions = np.concatenate([np.arange(s, e) for _, s, e in step])
        # One token bucket for every step (one compile), padding at the end
        # as the runner pads.
        pad = TOKENS - len(ids)
        assert pad >= PAD_TOKENS
        ids = np.pad(ids, (0, pad)).astype("int32")
        positions = np.pad(positions, (0, pad)).astype("int32")
        metadata = _metadata(step, positions, page_table)
        assert int(metadata.request_distribution[0]) == decodes
        hidden, caches = run(caches, jnp.asarray(ids), metadata)
        hidden = np.asarray(hidden)[:, 0]
        row = 0
        for seq, start, end in step:
            np.testing.assert_allclose(
                hidden[row : row + end - start], want[seq][start:end],
                rtol=1e-4, atol=1e-4,
                err_msg=f"sequence {seq}, tokens {start}:{end}",
            )
            row += end - start


def test_cached_generate_is_not_the_forward_pass():
    """KerasHub's cached decoding: seeding the caches with a right-padded
    prompt lets the padding into the linear layers' state, and the next
    step feeds the last prompt token through them again; its logits for
    the first new token differ from the forward pass's."""
    backbone = _backbone()
    causal_lm = testing.causal_lm_class("qwen3_5")(
        backbone=backbone, preprocessor=None
    )
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, backbone.vocabulary_size, 6).astype("int32")
    length = 12
    token_ids = np.zeros((1, length), "int32")
    token_ids[0, :6] = prompt
    padding_mask = np.zeros((1, length), "int32")
    padding_mask[0, :6] = 1
    _, cache = causal_lm._build_cache(token_ids, padding_mask)
    logits, _, _ = causal_lm.call_with_cache(
        token_ids[:, 5:6], cache, 5, padding_mask=None
    )
    cached = ops.convert_to_numpy(logits)[0, 0]
    forward = ops.convert_to_numpy(causal_lm({
        "token_ids": prompt[None], "padding_mask": np.ones((1, 6), "int32"),
    }))[0, -1]
    assert np.abs(cached - forward).max() > 1e-2


def test_one_token_prompt_in_a_decode_step_starts_from_a_fresh_state(patched):
    """tpu-inference's runner counts a request of one scheduled token as a
    decode, so a new one-token prompt can arrive in a decode-only step
    (`request_distribution[0] == [2]`), where `ragged_conv1d` takes its
    decode path and reads the slot as it is. The CPU kernel zeroes new
    requests' conv windows first: the output equals a run on zeroed state,
    whatever a finished request left in the slot."""
    from keras_vllm.layers.common.gated_delta_rule import conv1d_gdn

    n_kq, n_v, d_k, d_v, kernel = 1, 2, 4, 4, 4
    dim = 2 * n_kq * d_k + n_v * d_v
    rng = np.random.default_rng(2)

    def run(conv_state, recurrent_state):
        return conv1d_gdn(
            jnp.asarray(rng_x, jnp.float32),
            jnp.asarray(rng_b, jnp.float32),
            jnp.asarray(rng_a, jnp.float32),
            conv_state,
            recurrent_state,
            jnp.asarray(weight, jnp.float32),
            None,
            jnp.zeros((n_v,), jnp.float32),
            jnp.zeros((n_v,), jnp.float32),
            jnp.asarray([0, 1, 1], jnp.int32),  # one request, one token
            jnp.asarray([2, 0], jnp.int32),  # its slot; a padding row
            jnp.asarray([1, 1, 1], jnp.int32),  # decode-only step
            jnp.asarray([1, 0], jnp.int32),  # new: seq_len 1
            jnp.asarray([2, 0], jnp.int32),
            n_kq=n_kq, n_v=n_v, d_k=d_k, d_v=d_v, kernel_size=kernel,
        )

    rng_x = rng.standard_normal((1, dim))
    rng_b = rng.standard_normal((1, n_v))
    rng_a = rng.standard_normal((1, n_v))
    weight = rng.standard_normal((dim, 1, kernel))
    conv_shape, state_shape = (3, kernel - 1, dim), (3, n_v, d_k, d_v)
    stale = run(
        jnp.asarray(rng.standard_normal(conv_shape), jnp.float32),
        jnp.asarray(rng.standard_normal(state_shape), jnp.float32),
    )
    fresh = run(jnp.zeros(conv_shape), jnp.zeros(state_shape))
    np.testing.assert_allclose(stale[1], fresh[1], atol=1e-6)
    np.testing.assert_allclose(stale[0][0][2], fresh[0][0][2], atol=1e-6)
    np.testing.assert_allclose(stale[0][1][2], fresh[0][1][2], atol=1e-6)


def test_a_hybrid_reads_no_prompt_lengths():
    """The engine asks every swapped layer whether it reads prompt lengths
    (Phi-3's "su" RoPE does); a Gated DeltaNet layer is not a
    `PagedAttention` and must answer no, not stop the engine's start.
    Cost: one tiny backbone built, ~5 s."""
    from keras_vllm.layers import swap

    assert swap.needs_prompt_lengths(_backbone()) is False
