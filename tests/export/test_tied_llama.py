"""Llama with tied embeddings (Llama 3.2 1B / 3B) survives its config.

keras-hub 0.32's `LlamaBackbone.get_config()` leaves out
`tie_word_embeddings` (`keras_vllm/layers/llama_fixes.py`): a tied model
rebuilt from its config came back untied, one variable longer, and an
artifact of it failed to load. ~15 s (two tiny models, one export).
"""

import numpy as np
import pytest

import keras_vllm
from keras_vllm import testing
from keras_vllm.load.keras_loader import check_golden


@pytest.fixture(scope="module")
def tied():
    return testing.build_tiny_causal_lm("llama3", tie_word_embeddings=True)


def test_the_config_keeps_tied_embeddings(tied, tmp_path):
    import keras_hub

    assert tied.backbone.get_config()["tie_word_embeddings"] is True
    testing.save_tiny_preset(tied, tmp_path / "preset")
    reloaded = keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))
    assert reloaded.backbone.tie_word_embeddings
    assert len(reloaded.backbone.weights) == len(tied.backbone.weights)
    # An untied model's config is as keras-hub writes it (equal to configs
    # stored before the fix).
    untied = testing.build_tiny_causal_lm("llama3")
    assert "tie_word_embeddings" not in untied.backbone.get_config()


def test_a_tied_llama3_export_reloads_as_the_model(tied, tmp_path):
    path = tied.export_vllm(str(tmp_path / "artifact"))
    loaded = keras_vllm.load_causal_lm(path)
    assert loaded.backbone.tie_word_embeddings
    for want, got in zip(tied.backbone.weights, loaded.backbone.weights):
        assert want.path == got.path
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))
    assert check_golden(loaded, path) == []
