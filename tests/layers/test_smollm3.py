"""SmolLM3 works in Keras under keras-vllm, and its attention is found.

keras-hub 0.32's SmolLM3 layers fail under NNX and give several variables
one path; `import keras_vllm` fixes its classes
(`keras_vllm/layers/smollm3_fixes.py`). These tests use models built the
way users build them (plain keras-hub classes), including ones that were
never called eagerly before `generate()` / `fit()` (a preset, a reloaded
export), where the unbuilt rotary layer used to fail. Serving is checked by
`tests/serve/test_serving_*families.py` like every family.
"""

import keras
import keras_hub
import numpy as np
import pytest

import keras_vllm
from helpers.trained_models import trained
from keras_vllm import patching
from keras_vllm import testing
from keras_vllm.layers import swap
from keras_vllm.layers.common import registry
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.smollm3 import PagedSmolLM3Attention


def _backbone(**overrides):
    return keras_hub.models.SmolLM3Backbone(
        vocabulary_size=256, **testing.backbone_config("smollm3", **overrides)
    )


def test_keras_hub_classes_are_fixed_through_patching():
    from keras_hub.src.models.smollm3 import smollm3_layers as upstream

    for owner, name in [
        (upstream.SmolLM3Attention, "__setattr__"),
        (upstream.SmolLM3Attention, "__init__"),
        (upstream.SmolLM3Attention, "build"),
        (upstream.SmolLM3DecoderLayer, "__init__"),
    ]:
        assert patching.is_replacement(vars(owner)[name]), (owner, name)


def test_every_variable_has_its_own_path_under_its_layer():
    backbone = _backbone()
    paths = [v.path for v in backbone.weights]
    assert len(paths) == len(set(paths))
    for i in range(backbone.num_layers):
        assert f"transformer_layer_{i}/self_attn/o_proj/kernel" in paths
        assert f"transformer_layer_{i}/self_attn/rotary_emb/inv_freq" in paths
    assert "o_proj/kernel" not in paths


def test_attention_taking_its_cache_through_kwargs_is_found():
    backbone = _backbone()
    found = swap.find_attention_layers(backbone)
    assert found == [layer.self_attn for layer in backbone.transformer_layers]
    # The 4th layer of the tiny config, as every 4th of the 3B preset, has
    # no RoPE.
    assert [layer.use_rope for layer in found] == [True, True, True, False]
    spec = swap.kv_cache_specs(backbone)[0]
    assert (spec.num_query_heads, spec.num_kv_heads, spec.head_dim) == (4, 2, 16)
    swap.swap_in_paged_layers(backbone)
    assert all(type(layer) is PagedSmolLM3Attention for layer in found)
    assert [layer.kv_layer_index for layer in found] == [0, 1, 2, 3]


def test_a_registered_attention_class_counts_whatever_its_signature(monkeypatch):
    """Generic: the finder takes registered attention by class, and the block
    passing a cache down to it is not attention itself."""

    class KwargsAttention(keras.layers.Layer):
        def call(self, x, **kwargs):
            return x

    class PagedKwargsAttention(KwargsAttention, PagedAttention):
        def kv_cache_spec(self):
            raise NotImplementedError

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.attention = KwargsAttention()

        def call(self, x, cache=None):
            return self.attention(x)

    inputs = keras.Input((4,))
    blocks = [Block(), Block()]
    model = keras.Model(inputs, blocks[1](blocks[0](inputs)))
    assert swap.find_attention_layers(model) == blocks  # unregistered
    swap.registered_classes()
    monkeypatch.setitem(
        registry._PAGED_CLASSES, KwargsAttention, PagedKwargsAttention
    )
    assert swap.find_attention_layers(model) == [b.attention for b in blocks]


def test_partial_rotary_is_refused_by_name():
    backbone = _backbone(partial_rotary_factor=0.5)
    with pytest.raises(keras_vllm.UnsupportedModelError, match="partial_rotary"):
        swap.kv_cache_specs(backbone)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    directory = tmp_path_factory.mktemp("preset") / "tiny_smollm3"
    return testing.save_tiny_preset(trained("smollm3"), directory)


def test_a_preset_generates_and_fits_without_an_eager_call(preset):
    model = trained("smollm3")
    loaded = keras_hub.models.CausalLM.from_preset(preset)
    loaded.compile(sampler="greedy")
    prompts = testing.prompts()[:3]
    assert loaded.generate(prompts, max_length=24) == model.generate(
        prompts, max_length=24
    )
    np.testing.assert_array_equal(
        loaded.backbone.get_layer("transformer_layer_3").self_attn.o_proj.kernel,
        model.backbone.get_layer("transformer_layer_3").self_attn.o_proj.kernel,
    )
    losses = testing.fine_tune(loaded, steps=2)
    assert all(np.isfinite(losses))


def test_export_round_trips_and_the_reloaded_model_generates(tmp_path):
    model = trained("smollm3")
    path = model.export_vllm(tmp_path / "a", golden_prompts=testing.prompts())
    loaded = keras_vllm.load_causal_lm(path)
    want = {v.path: np.asarray(v.value) for v in model.backbone.weights}
    got = {v.path: np.asarray(v.value) for v in loaded.backbone.weights}
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    loaded.compile(sampler="greedy")
    prompts = testing.prompts()
    assert loaded.generate(prompts, max_length=32) == model.generate(
        prompts, max_length=32
    )


def test_variables_sharing_a_path_are_refused_with_the_fix():
    """Generic: a layer that builds a sublayer in its constructor (as
    keras-hub's unfixed SmolLM3 attention did) gives every instance one
    path; export says why and what to do instead of writing a bad file."""
    from keras_vllm.hub import weights

    class EagerlyBuilt(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.proj = keras.layers.Dense(4, name="proj")
            self.proj.build((None, 4))

        def call(self, x):
            return self.proj(x)

    inputs = keras.Input((4,))
    outputs = EagerlyBuilt(name="b")(EagerlyBuilt(name="a")(inputs))
    model = keras.Model(inputs, outputs)
    with pytest.raises(keras_vllm.ArtifactError) as refused:
        weights.backbone_weights(model)
    message = str(refused.value)
    assert "'proj/kernel'" in message
    assert "Import keras_vllm before building" in message
