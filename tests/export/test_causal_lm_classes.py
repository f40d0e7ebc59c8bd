"""Every `CausalLM` class of keras-hub ends served or refused by name.

keras-hub's `CausalLM` registry (its subclasses, encoder-decoder and
audio-to-text tasks included) is enumerated, so a class a new keras-hub
adds fails here until it is listed in `helpers.causal_lm_classes.OUTCOMES`.
Each class keras-vllm does not serve is exported as a tiny random model and
must be refused with `UnsupportedModelError` naming the class and what is
missing, before anything is written; `allow_unservable=True` still exports
such a model for Keras-side use where its Keras round trip works.
"""

import numpy as np
import pytest

import keras_vllm
from helpers import causal_lm_classes
from keras_vllm import testing
from keras_vllm.export import capabilities

UNSERVED = sorted(
    name for name, outcome in causal_lm_classes.OUTCOMES.items()
    if outcome != "served"
)


def test_every_keras_hub_causal_lm_class_is_listed():
    found = set(causal_lm_classes.keras_hub_causal_lm_classes())
    listed = set(causal_lm_classes.OUTCOMES)
    assert found - listed == set(), (
        "keras-hub has CausalLM classes keras-vllm neither serves nor "
        "refuses by name: add them to OUTCOMES (and the README's table)."
    )
    assert listed - found == set()


def test_served_classes_are_the_tested_families():
    served = {
        name for name, o in causal_lm_classes.OUTCOMES.items() if o == "served"
    }
    assert served == {
        testing.causal_lm_class(f).__name__ for f in testing.FAMILIES
    }


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_served_families_pass_the_structural_checks(family):
    backbone = testing.backbone_class(family)(
        **testing.backbone_config(family, vocabulary_size=256)
    )
    causal_lm = testing.causal_lm_class(family)(
        backbone=backbone, preprocessor=None
    )
    assert capabilities.refusal(causal_lm) is None


@pytest.mark.parametrize("name", UNSERVED)
def test_unserved_class_is_refused_by_name_before_writing(name, tmp_path):
    causal_lm = causal_lm_classes.tiny_unserved(name)
    with pytest.raises(keras_vllm.UnsupportedModelError) as raised:
        keras_vllm.export_vllm(causal_lm, tmp_path / "a")
    message = str(raised.value)
    assert name in message
    assert "Missing capability" in message or "no paged subclass" in message \
        or "no attention layers" in message
    assert causal_lm_classes.matches(name, message), message
    assert not (tmp_path / "a").exists()


def _with_tokenizer(name):
    """A tiny unserved model with a tokenizer trained offline (the Llama 3
    BPE, through keras-hub's generic preprocessor) and the vocabulary its
    embedding needs."""
    import keras_hub

    tokenizer = testing.build_tiny_tokenizer("llama3")
    size = tokenizer.vocabulary_size()
    causal_lm = causal_lm_classes.tiny_unserved(name, vocabulary_size=size)
    causal_lm.preprocessor = keras_hub.models.CausalLMPreprocessor(
        tokenizer=tokenizer, sequence_length=16
    )
    return causal_lm


@pytest.mark.parametrize("name", ["GptOssCausalLM", "PaliGemmaCausalLM"])
def test_allow_unservable_exports_for_keras_side_use(name, tmp_path):
    causal_lm = _with_tokenizer(name)
    path = keras_vllm.export_vllm(
        causal_lm, tmp_path / "a", allow_unservable=True,
        golden_prompts=["the"], golden_max_new_tokens=2,
    )
    from keras_vllm import format as fmt

    manifest = fmt.open_artifact(path).manifest
    assert manifest["servable"] is False
    assert name in manifest["unservable_reason"]
    loaded = keras_vllm.load_causal_lm(path)
    for a, b in zip(causal_lm.backbone.weights, loaded.backbone.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    golden = fmt.open_artifact(path).read_json(fmt.GOLDEN_FILE)
    # A model whose generate() needs images records no text golden output.
    expected = 0 if capabilities.extra_inputs(causal_lm.backbone) else 1
    assert len(golden["outputs"]) == expected


def test_readme_lists_every_refused_class():
    import os

    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("### KerasHub classes not served"):]
    for name in UNSERVED:
        assert f"`{name}`" in table, name
