"""No model silently serves a dense or wrong path: export and load refuse a
backbone whose attention class has no paged subclass, naming the class."""

import pytest

import keras_vllm
from helpers.trained_models import trained
from keras_vllm.layers.common import registry
from keras_vllm.layers import swap


@pytest.fixture
def without_llama_attention(monkeypatch):
    from keras_hub.src.models.llama.llama_attention import LlamaAttention

    swap.registered_classes()  # every family is registered
    monkeypatch.delitem(registry._PAGED_CLASSES, LlamaAttention)


def test_export_refuses_unsupported_attention(without_llama_attention, tmp_path):
    with pytest.raises(keras_vllm.UnsupportedModelError, match="LlamaAttention"):
        trained("llama").export_vllm(tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_keras_only_export_is_possible_but_not_servable(
    without_llama_attention, tmp_path
):
    path = trained("llama").export_vllm(
        tmp_path / "a", allow_unservable=True, golden_prompts=["a"]
    )
    from keras_vllm import format as fmt

    manifest = fmt.open_artifact(path).manifest
    assert manifest["servable"] is False
    assert "LlamaAttention" in manifest["unservable_reason"]
    assert keras_vllm.load_causal_lm(path) is not None
    from keras_vllm.serve import preflight

    with pytest.raises(keras_vllm.ServingError, match="LlamaAttention"):
        preflight.check(path)


def test_load_refuses_unsupported_attention(tmp_path, monkeypatch):
    path = trained("llama").export_vllm(tmp_path / "a", golden_prompts=["a"])
    from keras_hub.src.models.llama.llama_attention import LlamaAttention

    monkeypatch.delitem(registry._PAGED_CLASSES, LlamaAttention)
    backbone = keras_vllm.load_causal_lm(path).backbone
    with pytest.raises(keras_vllm.UnsupportedModelError, match="LlamaAttention"):
        swap.swap_in_paged_layers(backbone)


def test_readme_table_is_generated_from_the_registry():
    import os

    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    assert swap.supported_families_table() in text
