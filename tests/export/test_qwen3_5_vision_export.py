"""Qwen 3.5 / Qwen 3.5 MoE with their vision encoder, Keras-side (no
engine; the served text decoder's tokens and logprobs are checked by
`tests/serve/test_serving_vision_as_text.py`).

Every Qwen 3.5 preset in KerasHub 0.32 carries a `Qwen3_5VisionEncoder`:
such a `CausalLM` exports whole, its artifact says it serves text only
(the backbone's `image_grid_thw`, `pixel_values` and `vision_indices`
inputs are unserved), Keras loads it back with its encoder, and the text
decoder the engine builds (`load/text_decoder.py::served_backbone`)
computes on a text prompt what the whole model computes.
"""

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.hub import reference
from keras_vllm.load.text_decoder import served_backbone
from helpers.qwen3_5_vision import with_vision_encoder

VISION_INPUTS = ["image_grid_thw", "pixel_values", "vision_indices"]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_vision_model_serves_its_text_decoder(family, tmp_path):
    text_lm = testing.build_tiny_causal_lm(family)
    causal_lm = with_vision_encoder(text_lm)
    # Golden outputs are recorded by the forward pass of the text decoder
    # (the whole backbone takes vision inputs too); the generic path is
    # checked on the cheaper tiny model (2 layers, not 4) only.
    prompts = ["the", "a b c"] if family == "qwen3_5_moe" else []
    path = keras_vllm.export_vllm(
        causal_lm, tmp_path / "artifact", golden_prompts=prompts,
        golden_max_new_tokens=4,
    )
    manifest = fmt.open_artifact(path).manifest
    golden = fmt.open_artifact(path).read_json(fmt.GOLDEN_FILE)["outputs"]
    assert len(golden) == len(prompts)
    for record in golden:
        assert record["output_ids"] == reference.greedy_by_forward_pass(
            text_lm, record["prompt_ids"], 4, []
        )
    assert manifest["servable"] is True
    assert manifest["modalities"] == {
        "served": ["text"], "unserved_inputs": VISION_INPUTS,
    }
    loaded = keras_vllm.load_causal_lm(path)
    assert loaded.backbone.vision_encoder is not None

    decoder = served_backbone(causal_lm.backbone, manifest)
    assert decoder.vision_encoder is None
    assert decoder.mrope_section == causal_lm.backbone.mrope_section
    names = sorted(t.name.split(":")[0] for t in decoder.inputs)
    assert names == ["padding_mask", "token_ids"]
    # The decoder holds the whole backbone's arrays, not copies.
    assert decoder.layer_norm.weights[0].value is (
        causal_lm.backbone.layer_norm.weights[0].value
    )

    ids = np.asarray(
        [[2, 17, 40, 33, 65, 7, 11, 13, 90, 5],
         [9, 21, 4, 60, 8, 0, 0, 0, 0, 0]], "int32"
    )
    mask = (np.arange(10) < np.asarray([[10], [5]])).astype("int32")
    hidden = decoder({"token_ids": ids, "padding_mask": mask})
    served_logits = decoder.token_embedding(hidden, reverse=True)
    whole = causal_lm(
        {
            "token_ids": ids,
            "padding_mask": mask,
            "pixel_values": np.zeros((2, 0, 2, 4, 4, 3), "float32"),
            "image_grid_thw": np.zeros((2, 0, 3), "int32"),
            "vision_indices": np.zeros((2, 0), "int32"),
        }
    )
    np.testing.assert_allclose(
        np.asarray(served_logits)[mask.astype(bool)],
        np.asarray(whole)[mask.astype(bool)],
        atol=1e-5,
    )
