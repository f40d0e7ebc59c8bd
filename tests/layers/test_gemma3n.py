"""Gemma 3n: the KV cache facts its paged attention gives vLLM, and what
keras-vllm fixes in KerasHub's model (`layers/gemma3n_fixes.py`).

Unit level (no engine), on one untrained tiny model (30-60 s to build on
the shared 2-core host; the tests then take about 60 s, most of it the
export and forward passes of the model with encoders). The served path (greedy tokens, prompt logprobs, default sampling,
golden outputs, the caches vLLM allocates) is checked by the family
serving tests.
"""

import numpy as np
import pytest

from keras_vllm import testing
from keras_vllm.export.kv_layout import kv_layout
from keras_vllm.layers import swap


@pytest.fixture(scope="module")
def causal_lm():
    return testing.build_tiny_causal_lm("gemma3n")


def _inputs(causal_lm):
    """The first 8 corpus tokens, the shape `build_tiny_causal_lm` calls the
    model on (its eager op compilations are reused)."""
    x, _, _ = testing.tokenize_corpus(causal_lm.preprocessor.tokenizer)
    return {key: value[:1, :8] for key, value in x.items()}


def test_attention_layers_in_decoder_order_and_their_caches(causal_lm):
    """The decoder is nested in the backbone: its layers are found in its
    own order (vLLM's `layer.{i}`), the last two read the cache of the
    last earlier layer of their kind, and sliding-window layers keep
    KerasHub's `q - k < sliding_window`."""
    backbone = causal_lm.backbone
    layers = swap.find_attention_layers(backbone)
    assert [layer.path for layer in layers] == [
        f"text_model/decoder_block_{i}/attention" for i in range(6)
    ]
    specs = swap.kv_cache_specs(backbone)
    assert [s.sliding_window for s in specs] == [16, 16, None] * 2
    assert [s.shares_cache for s in specs] == [False] * 4 + [True] * 2
    assert {(s.num_query_heads, s.num_kv_heads, s.head_dim) for s in specs} \
        == {(4, 2, 16)}
    fields = kv_layout(backbone)
    assert fields["layer_types"] == [
        "sliding_attention", "sliding_attention", "full_attention"
    ] * 2
    assert fields["sliding_window"] == 16
    assert fields["num_kv_shared_layers"] == 2


def test_backbone_reads_as_a_text_decoder_with_a_live_head(causal_lm):
    """`hidden_dim`, `vocabulary_size` and a reversible `token_embedding`
    over the nested text model; and the `CausalLM`'s logits read the tied
    table at each call (KerasHub's functional graph froze it at
    construction, while `generate()` reads it live)."""
    backbone = causal_lm.backbone
    vocab = causal_lm.preprocessor.tokenizer.vocabulary_size()
    assert (backbone.hidden_dim, backbone.vocabulary_size) == (64, vocab)
    embedding = backbone.token_embedding
    table = backbone.language_model.embed_tokens.embedding.embeddings
    assert embedding.embeddings is table
    inputs = _inputs(causal_lm)
    hidden = backbone(inputs)
    before = np.asarray(causal_lm(inputs))
    np.testing.assert_allclose(
        np.asarray(embedding(hidden, reverse=True)), before, atol=1e-5
    )
    # Soft-capped at the backbone's 30.
    assert np.abs(np.asarray(embedding(hidden * 1e3, reverse=True))).max() \
        <= 30.0
    # Rows of ids the inputs do not hold change the logits only.
    unused = np.setdiff1d(np.arange(vocab), inputs["token_ids"])
    original = np.asarray(table.value)
    try:
        table.assign(_with_rows_zeroed(original, unused))
        after = np.asarray(causal_lm(inputs))
        assert np.abs(after - before).max() > 0.1
        np.testing.assert_allclose(
            after, np.asarray(embedding(hidden, reverse=True)), atol=1e-5
        )
    finally:
        table.assign(original)
    # The head owns no variable: the model's are the backbone's, once.
    assert len(causal_lm.weights) == len(backbone.weights)


def _with_rows_zeroed(table, rows):
    table = table.copy()
    table[rows] = 0.0
    return table


def test_enable_lora_adapts_the_query_and_value_projections():
    """KerasHub's default LoRA targets (`query_dense`, `value_dense`, ...)
    name no Gemma 3n layer; the backbone names its `q_proj` and `v_proj`."""
    config = testing.backbone_config("gemma3n", vocabulary_size=64)
    backbone = testing.backbone_class("gemma3n")(**config)
    assert backbone.default_lora_layer_names() == ["q_proj", "v_proj"]
    backbone.enable_lora(2)
    adapted = [
        layer.path for layer in backbone._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    ]
    assert sorted(adapted) == sorted(
        f"text_model/decoder_block_{i}/attention/{name}"
        for i in range(6) for name in ("q_proj", "v_proj")
    )


def test_text_decoder_drops_the_encoders_only():
    config = testing.backbone_config("gemma3n", vocabulary_size=64)
    assert swap.text_decoder_config(
        config, testing.backbone_class("gemma3n")
    ) is None
    with_encoders = dict(
        config, vision_encoder_config={"a": 1}, audio_encoder_config={"b": 2}
    )
    decoder = swap.text_decoder_config(
        with_encoders, testing.backbone_class("gemma3n")
    )
    assert decoder == dict(
        config, vision_encoder_config=None, audio_encoder_config=None
    )


def test_encoder_model_exports_whole_and_serves_its_text_decoder(
    causal_lm, tmp_path
):
    """With a vision and an audio encoder (every preset), the model exports
    whole, its artifact says it serves text only, and the decoder the
    engine builds (`load/text_decoder.py::served_backbone`) holds the whole
    backbone's arrays and computes its logits on a text prompt."""
    from helpers.gemma3n_encoders import ForwardWithoutEncoders
    from helpers.gemma3n_encoders import with_encoders

    from keras_vllm import format as fmt
    from keras_vllm.load.text_decoder import served_backbone

    model = with_encoders(causal_lm)
    path = model.export_vllm(tmp_path / "artifact", golden_prompts=())
    artifact = fmt.open_artifact(path)
    # What the engine checks before it starts (the vision encoder's config
    # holds negative list indices).
    artifact.validate()
    manifest = artifact.manifest
    assert manifest["servable"] is True
    assert manifest["modalities"] == {
        "served": ["text"],
        "unserved_inputs": ["images", "input_features", "input_features_mask"],
    }
    decoder = served_backbone(model.backbone, manifest)
    assert decoder.vision_encoder is None and decoder.audio_encoder is None
    assert sorted(t.name.split(":")[0] for t in decoder.inputs) == [
        "padding_mask", "token_ids"
    ]
    table = decoder.language_model.embed_tokens.embedding.embeddings
    assert table.value is (
        model.backbone.language_model.embed_tokens.embedding.embeddings.value
    )
    inputs = _inputs(causal_lm)
    served = decoder.token_embedding(decoder(inputs), reverse=True)
    np.testing.assert_allclose(
        np.asarray(served),
        np.asarray(ForwardWithoutEncoders(model)(inputs)),
        atol=1e-5,
    )


def test_an_nnx_step_takes_every_weight_as_an_argument(causal_lm):
    """tpu-inference splits the served model with flax NNX and merges it
    inside its jitted step: every weight must reach the step as an
    argument. KerasHub keeps Gemma 3n's decoder blocks in a Keras
    `TrackedList`, which NNX does not traverse, so their weights were baked
    into the program as constants (LoRA slots and weight updates never
    reached it); `gemma3n_fixes` rebinds those lists."""
    import jax
    from flax import nnx

    class Holder(nnx.Module):
        def __init__(self, backbone):
            self.backbone = backbone

    graph, state = nnx.split(Holder(causal_lm.backbone))
    structure = jax.tree_util.tree_structure(state)
    leaves = jax.tree_util.tree_leaves(state)
    inputs = _inputs(causal_lm)

    def step(leaves):
        merged = nnx.merge(graph, jax.tree_util.tree_unflatten(structure, leaves))
        return merged.backbone(inputs)

    program = jax.make_jaxpr(step)(leaves)
    weights = [c for c in program.consts if np.size(c) > 16]
    assert weights == []
    assert len(leaves) == len(causal_lm.backbone.weights)


@pytest.mark.parametrize("encoders, ranges", [
    # The E2B / E4B presets: 262,400 text ids, the vision vocabulary's 128
    # from 262,144, the audio vocabulary's from 262,272 (inside the text
    # table, so the served decoder would embed them as text).
    ({"vision": True, "audio": True},
     [(262144, 262272), (262272, 2**31 - 1)]),
    ({"vision": True, "audio": False}, [(262144, 262272)]),
    ({"vision": False, "audio": False}, []),
])
def test_ids_the_encoders_embed(encoders, ranges):
    """The ids keras-hub's `Gemma3nBackbone` embeds with its vision and
    audio embedders instead of its text table (what the serving front end
    refuses: `serve/frontend/encoder_tokens.py`)."""
    from keras_vllm.layers.common import registry

    config = {
        "vision_encoder_config": {"name": "v"} if encoders["vision"] else None,
        "vision_vocab_offset": 262144,
        "vision_vocab_size": 128,
        "audio_encoder_config": {"name": "a"} if encoders["audio"] else None,
        "audio_vocab_offset": 262272,
        "audio_vocab_size": 128,
    }
    backbone_cls = testing.backbone_class("gemma3n")
    assert registry.encoder_token_ids(backbone_cls, config) == ranges
