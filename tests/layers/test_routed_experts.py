"""The routed mixture-of-experts blocks equal KerasHub's dense blocks.

Unit level (no engine): each MoE family's routed subclass
(`keras_vllm/layers/<family>.py`) against the KerasHub block it replaces,
on the same weights, including router ties constructed on purpose and the
padding rows of a token bucket. The served path (greedy tokens and prompt
logprobs against Keras) is checked for every MoE family by
`test_serving_more_families.py`, at TP=2 by `test_tensor_parallel.py`
(Mixtral) and int8 by `test_quantized_serving.py` (Mixtral).
"""

import numpy as np
import pytest

from keras_vllm import envs
from keras_vllm import testing
from keras_vllm.layers import swap

MOE_FAMILIES = ("mixtral", "qwen_moe", "qwen3_moe")


def _backbone(family, **overrides):
    config = testing.backbone_config(family, **overrides)
    return testing.backbone_class(family)(**config, vocabulary_size=64)


def _blocks(backbone):
    layers = backbone._flatten_layers(include_self=False, recursive=True)
    return [layer for layer in layers if hasattr(layer, "expert_bank")]


def _pair(family, **overrides):
    """A KerasHub MoE block and a routed copy with the same weights."""
    keras_block = _blocks(_backbone(family, **overrides))[0]
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
    router = keras_block._sparse_feedforward_gate_dense
    column = np.random.default_rng(7).standard_normal(keras_block.hidden_dim)
    kernel = np.stack([-column, column, column, column], axis=1)
    for block in (keras_block, routed):
        block._sparse_feedforward_gate_dense.kernel.assign(
            kernel.astype("float32")
        )
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
    shared = routed.shared_expert(tokens)
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


def test_dense_switch_serves_the_keras_block(monkeypatch):
    keras_block, routed = _pair("mixtral")
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
