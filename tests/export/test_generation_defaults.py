"""The artifact's `generation_config.json` follows the compiled sampler."""

import json
import os
import warnings

import keras_hub
import pytest

from helpers.trained_models import trained
from keras_vllm import format as fmt


def _generation_config(causal_lm, sampler, path):
    causal_lm.compile(sampler=sampler)
    try:
        exported = causal_lm.export_vllm(path, golden_prompts=["a"])
    finally:
        causal_lm.compile(sampler="greedy")
    with open(os.path.join(exported, fmt.GENERATION_CONFIG_FILE)) as f:
        return json.load(f), fmt.open_artifact(exported).manifest


@pytest.mark.parametrize(
    "sampler, expected",
    [
        ("greedy", {"temperature": 0.0, "do_sample": False}),
        (
            keras_hub.samplers.TopKSampler(k=7, temperature=0.5),
            {"top_k": 7, "temperature": 0.5, "do_sample": True},
        ),
        (
            keras_hub.samplers.TopPSampler(p=0.8, temperature=0.9),
            {"top_p": 0.8, "temperature": 0.9, "do_sample": True},
        ),
        (
            keras_hub.samplers.RandomSampler(temperature=1.3),
            {"temperature": 1.3, "do_sample": True},
        ),
    ],
)
def test_sampler_becomes_vllm_defaults(sampler, expected, tmp_path):
    config, manifest = _generation_config(
        trained("gpt2"), sampler, tmp_path / "a"
    )
    for key, value in expected.items():
        assert config[key] == pytest.approx(value), key
    assert config["eos_token_id"] == manifest["stop_token_ids"]
    assert manifest["sampler_in_vllm"] is True
    from transformers import GenerationConfig

    loaded = GenerationConfig.from_pretrained(str(tmp_path / "a"))
    assert loaded.temperature == pytest.approx(expected["temperature"])


def test_beam_search_model_warns_at_export(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, manifest = _generation_config(
            trained("gpt2"), "beam", tmp_path / "beam"
        )
    assert any("no vLLM equivalent" in str(w.message) for w in caught)
    assert manifest["sampler_in_vllm"] is False
    assert manifest["sampler"]["class_name"] == "BeamSampler"
    assert "temperature" not in config
