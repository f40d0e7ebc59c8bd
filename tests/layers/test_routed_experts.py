"""The routed mixture-of-experts blocks equal KerasHub's dense blocks.

Unit level (no engine): each MoE family's routed subclass
(`keras_vllm/layers/<family>.py`) against the KerasHub block it replaces,
on the same weights, including router ties constructed on purpose and the
padding rows of a token bucket. The served path (greedy tokens and prompt
logprobs against Keras) is checked for every MoE family by the family
serving tests (`helpers/family_serving.py`), at TP=2 by
`test_tensor_parallel.py` (Mixtral, GPT-OSS) and int8 by
`test_quantized_serving.py` (Mixtral).

GPT-OSS's block differs from the others: top-k on the router's logits,
then a softmax over the k; experts with biases and clamped SwiGLU on
interleaved gate/up columns. Its zero-initialised biases are randomised
here so that they count, and one test drives the clamps.
"""

import numpy as np
import pytest

from keras_vllm import envs
from keras_vllm import testing
from keras_vllm.layers import swap
from keras_vllm.layers.common.routed_experts import RoutedExperts

MOE_FAMILIES = (
    "mixtral", "qwen_moe", "qwen3_moe", "gpt_oss", "qwen3_5_moe",
)


def _backbone(family, **overrides):
    config = testing.backbone_config(family, **overrides)
    return testing.backbone_class(family)(**config, vocabulary_size=64)


def _blocks(backbone):
    layers = backbone._flatten_layers(include_self=False, recursive=True)
    return [
        layer for layer in layers
        if issubclass(swap.paged_class_for(layer) or object, RoutedExperts)
    ]


def _router(block):
    """The router's Dense layer (GPT-OSS keeps it in a router sublayer)."""
    if hasattr(block, "_sparse_feedforward_gate_dense"):
        return block._sparse_feedforward_gate_dense
    if hasattr(block, "_router_gate"):  # Qwen 3.5 MoE
        return block._router_gate
    return block.router.router_dense


def _randomize_biases(block, seed=11):
    """Random values in the block's zero-initialised biases (GPT-OSS's
    router and experts), so that a missing bias shows."""
    rng = np.random.default_rng(seed)
    for weight in block.weights:
        if "bias" in weight.path and not np.asarray(weight).any():
            weight.assign(
                0.5 * rng.standard_normal(weight.shape).astype("float32")
            )


def _pair(family, **overrides):
    """A KerasHub MoE block and a routed copy with the same weights."""
    keras_block = _blocks(_backbone(family, **overrides))[0]
    _randomize_biases(keras_block)
    served = _backbone(family, **overrides)
    routed = _blocks(served)[0]
    routed.set_weights(keras_block.get_weights())
    swap.swap_in_paged_layers(served)
    assert type(routed) is swap.paged_class_for(type(keras_block))
    return keras_block, routed


def _tokens(count, hidden, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal((1, count, hidden))).astype("float32")


@pytest.fixture(autouse=True)
def _routed(monkeypatch):
    monkeypatch.delenv(envs.MOE_EXPERTS.name, raising=False)


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("count", [1, 5, 40])
def test_routed_block_equals_keras_block(family, count):
    keras_block, routed = _pair(family)
    x = _tokens(count, keras_block.hidden_dim, seed=count)
    want, want_logits = keras_block(x)
    got, got_logits = routed(x)
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_router_ties_are_decided_like_keras(family):
    """Experts 1, 2 and 3 get the same router column, expert 0 its
    negation: for every token, experts 1-3 tie for the top two slots.
    `jax.lax.top_k` (KerasHub's `ops.top_k`) keeps the lower indices, 1
    and 2; picking expert 3 instead would change the output."""
    keras_block, routed = _pair(family)
    router = _router(keras_block)
    column = np.random.default_rng(7).standard_normal(keras_block.hidden_dim)
    kernel = np.stack([-column, column, column, column], axis=1)
    for block in (keras_block, routed):
        _router(block).kernel.assign(kernel.astype("float32"))
        if _router(block).bias is not None:
            _router(block).bias.assign(np.zeros(4, "float32"))
    x = _tokens(9, keras_block.hidden_dim, seed=3)
    # Tokens on the positive side of the column: experts 1-3 tie on top.
    x = x * np.sign(x[0] @ column)[None, :, None]
    logits = np.asarray(router(x[0]))
    assert (logits[:, 1] == logits[:, 3]).all()
    assert (logits[:, 1] > logits[:, 0]).all()

    want, _ = keras_block(x)
    got, _ = routed(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    tokens = x.reshape(-1, keras_block.hidden_dim)
    _, weights, experts = routed.route(tokens)
    assert np.asarray(experts).tolist() == [[1, 2]] * 9
    # The tie matters: expert 3 in place of expert 2 gives another output.
    other = routed.routed_output(
        tokens, weights, np.asarray([[1, 3]] * 9, dtype="int32")
    )
    shared = routed.shared_expert_output(tokens)
    if shared is not None:
        other = other + shared
    assert np.abs(np.asarray(other) - np.asarray(want[0])).max() > 1e-3


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_padding_rows_reach_no_expert(family):
    """A bucket's padding tokens (past `num_valid`) are computed by no
    expert; the real tokens' outputs do not change."""
    _, routed = _pair(family)
    tokens = _tokens(12, routed.hidden_dim, seed=5)[0]
    _, weights, experts = routed.route(tokens)
    full = np.asarray(routed.routed_output(tokens, weights, experts))
    part = np.asarray(routed.routed_output(tokens, weights, experts, 5))
    np.testing.assert_allclose(part[:5], full[:5], rtol=1e-6, atol=1e-6)
    assert (part[5:] == 0).all() and (np.abs(full[5:]) > 0).any()
    # A data-parallel batch pads each replica's block: a mask says which
    # rows are real (here 4 + 2 padding, twice).
    mask = np.array(([True] * 4 + [False] * 2) * 2)
    masked = np.asarray(routed.routed_output(tokens, weights, experts, mask))
    np.testing.assert_allclose(masked[mask], full[mask], rtol=1e-6, atol=1e-6)
    assert (masked[~mask] == 0).all()


def test_more_experts_and_larger_top_k():
    """32 experts, top 4: every expert's group sized differently, groups
    spanning several tiles and experts no token picked."""
    keras_block, routed = _pair(
        "qwen3_moe", num_experts=32, top_k=4, moe_intermediate_dim=16
    )
    for count in (1, 3, 70):
        x = _tokens(count, keras_block.hidden_dim, seed=count)
        want, _ = keras_block(x)
        got, _ = routed(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_dense_switch_serves_the_keras_block(monkeypatch, family):
    keras_block, routed = _pair(family)
    monkeypatch.setenv(envs.MOE_EXPERTS.name, "dense")
    x = _tokens(6, keras_block.hidden_dim)
    want, _ = keras_block(x)
    got, _ = routed(x)
    np.testing.assert_array_equal(got, want)
    monkeypatch.setenv(envs.MOE_EXPERTS.name, "sparse")
    with pytest.raises(ValueError, match="KERAS_VLLM_MOE_EXPERTS"):
        routed(x)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_swap_reclasses_moe_blocks_not_attention(family):
    backbone = _backbone(family)
    attention = swap.find_attention_layers(backbone)
    swap.swap_in_paged_layers(backbone)
    blocks = _blocks(backbone)
    assert len(blocks) == backbone.num_layers
    assert all(getattr(b, "_is_paged_layer", False) for b in blocks)
    assert swap.find_attention_layers(backbone) == attention


def test_gpt_oss_clamps_and_biases():
    """Expert kernels large enough that the gate and up projections pass
    the clamps (7) in both directions: the routed experts clamp as
    KerasHub's do, after their biases."""
    keras_block, routed = _pair("gpt_oss")
    bank = keras_block.experts
    rng = np.random.default_rng(3)
    kernel = rng.standard_normal(bank.gate_up_proj.shape).astype("float32")
    for block in (keras_block, routed):
        block.experts.gate_up_proj.assign(kernel)
    x = _tokens(24, keras_block.hidden_dim, seed=4)
    gate_up = np.einsum("th,ehm->etm", x[0], bank.gate_up_proj)
    assert (gate_up[..., ::2] > bank.limit).any()
    assert (np.abs(gate_up[..., 1::2]) > bank.limit).any()
    want, want_scores = keras_block(x)
    got, got_scores = routed(x)
    np.testing.assert_allclose(got_scores, want_scores, rtol=0, atol=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_grouped_kernel_path_adds_each_rows_biases(monkeypatch, family):
    """The TPU path (grouped matmuls over expert-sorted rows), with
    tpu-inference's kernel (TPU only) replaced by a per-row reference:
    each row gets its own expert's biases, padding rows none, and the
    result equals the CPU tile loop's."""
    import jax.numpy as jnp

    from keras_vllm.layers.common import expert_groups

    def grouped_matmul(rows, counts, kernel):
        ends = jnp.cumsum(counts)
        ids = jnp.arange(rows.shape[0])
        expert = jnp.sum(ends[None, :] <= ids[:, None], axis=1)
        expert = jnp.minimum(expert, kernel.shape[0] - 1)
        out = jnp.einsum("nh,nhm->nm", rows, kernel[expert])
        return jnp.where((ids < ends[-1])[:, None], out, 0.0)

    monkeypatch.setattr(expert_groups, "grouped_matmul_tpu", grouped_matmul)
    _, routed = _pair(family)
    tokens = _tokens(12, routed.hidden_dim, seed=8)[0]
    _, weights, experts = routed.route(tokens)
    want = np.asarray(routed.routed_output(tokens, weights, experts, 7))
    got = np.asarray(routed.routed_output(
        tokens, weights, experts, 7, grouped_kernel=True
    ))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got[7:] == 0).all()


@pytest.mark.parametrize("count", [1, 40])
def test_gemma4_routed_expert_bank_equals_keras_bank(count):
    """Gemma 4's expert bank takes its router's dense dispatch weights; the
    routed bank computes only the top-k experts the router chose (top-k read
    from the decoder block's router when swapped in)."""
    def moe_layers(backbone):
        block = backbone.get_layer("decoder_block_0")
        return block.moe_router, block.moe_expert_bank

    keras_backbone = _backbone("gemma4", num_layers=1)
    served = _backbone("gemma4", num_layers=1)
    served.set_weights(keras_backbone.get_weights())
    swap.swap_in_paged_layers(served)
    router, keras_bank = moe_layers(keras_backbone)
    _, routed = moe_layers(served)
    assert type(routed) is swap.paged_class_for(type(keras_bank))
    assert routed.routed_top_k == 2
    x = _tokens(count, 64, seed=count)
    # Per-expert scales that differ, so each must reach its expert.
    scales = np.linspace(0.5, 2.0, 4).astype("float32")
    keras_bank.per_expert_scale.assign(scales)
    routed.per_expert_scale.assign(scales)
    dispatch = router(x)
    tokens = x.reshape(-1, 64)
    want = np.asarray(keras_bank(tokens, dispatch))
    got = np.asarray(routed(tokens, dispatch))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
