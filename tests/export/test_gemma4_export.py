"""Gemma 4 at export, Keras-side only (no engine; serving exactness is
checked by `tests/serve/test_serving_families.py`, families `gemma4` and
`gemma4_e2b`).

A Gemma 4 `CausalLM` with its vision encoder (every Gemma 4 preset has
one) exports whole and is served as its text decoder: the artifact says it
serves text only, and the decoder the engine builds
(`load/text_decoder.py::served_backbone`) computes on a text prompt what
the whole model computes. A logit cap the task applies outside the
backbone (`final_logit_cap`) is refused by name.
"""

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.load.text_decoder import served_backbone

PIXEL_INPUTS = ["pixel_position_ids", "pixel_values", "vision_indices",
                "vision_mask"]


def _with_vision_encoder():
    import keras_hub
    from keras_hub.src.models.gemma4.gemma4_vision_encoder import (
        Gemma4VisionEncoder,
    )

    text_lm = testing.build_tiny_causal_lm("gemma4", num_layers=6)
    config = text_lm.backbone.get_config()
    config["vision_encoder"] = Gemma4VisionEncoder(
        image_size=16, patch_size=4, num_heads=2, hidden_dim=16,
        num_layers=1, intermediate_dim=32, head_dim=8,
        output_dim=config["hidden_dim"], pool_size=2,
        position_embedding_size=16, name="gemma4_vision_encoder",
    )
    backbone = keras_hub.models.Gemma4Backbone(**config)
    return keras_hub.models.Gemma4CausalLM(
        backbone=backbone, preprocessor=text_lm.preprocessor
    )


def test_vision_model_serves_its_text_decoder(tmp_path):
    causal_lm = _with_vision_encoder()
    path = keras_vllm.export_vllm(
        causal_lm, tmp_path / "artifact", golden_prompts=()
    )
    manifest = fmt.open_artifact(path).manifest
    assert manifest["servable"] is True
    assert manifest["modalities"] == {
        "served": ["text"], "unserved_inputs": PIXEL_INPUTS,
    }
    decoder = served_backbone(causal_lm.backbone, manifest)
    assert decoder.vision_encoder is None
    names = sorted(t.name.split(":")[0] for t in decoder.inputs)
    assert names == ["padding_mask", "position_ids", "token_ids"]

    ids = np.asarray([[2, 17, 40, 33, 65, 7, 11, 13, 90, 5]], "int32")
    text = testing.with_position_ids(
        causal_lm, {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    )
    hidden = decoder(text)
    served_logits = decoder.token_embedding(hidden, reverse=True)
    whole = causal_lm(
        {
            **text,
            "pixel_values": np.zeros((1, 0, 16, 3 * 4 * 4), "float32"),
            "pixel_position_ids": np.zeros((1, 0, 16, 2), "int32"),
            "vision_indices": np.zeros((1, 0), "int32"),
            "vision_mask": np.zeros_like(ids),
        }
    )
    np.testing.assert_allclose(
        np.asarray(served_logits), np.asarray(whole), atol=1e-5
    )


def test_final_logit_cap_outside_the_backbone_is_refused(tmp_path):
    import keras_hub

    text_lm = testing.build_tiny_causal_lm("gemma4", num_layers=1)
    capped = keras_hub.models.Gemma4CausalLM(
        backbone=text_lm.backbone, preprocessor=text_lm.preprocessor,
        final_logit_cap=30.0,
    )
    with pytest.raises(keras_vllm.UnsupportedModelError, match="final_logit_cap"):
        keras_vllm.export_vllm(capped, tmp_path / "artifact")
    assert not (tmp_path / "artifact").exists()


def test_a_gemma4_preset_loads_as_the_text_generator_not_its_drafter(
    tmp_path,
):
    # keras-hub registers two CausalLM classes for `Gemma4Backbone` (the
    # model and its MTP drafter) and `CausalLM.from_preset` picks either;
    # `keras-vllm export PRESET` must build the model.
    import keras_hub

    from keras_vllm.export.capabilities import preset_causal_lm_class

    preset = testing.save_tiny_preset(
        testing.build_tiny_causal_lm("gemma4"), tmp_path / "preset"
    )
    assert preset_causal_lm_class(preset) is keras_hub.models.Gemma4CausalLM
    llama = testing.save_tiny_preset(
        testing.build_tiny_causal_lm("llama"), tmp_path / "llama"
    )
    assert preset_causal_lm_class(llama) is keras_hub.models.LlamaCausalLM


# ~2 minutes of CI (quantizing the tiny Gemma 4); in `-m matrix`.
@pytest.mark.matrix
def test_a_quantized_ffn_keras_hub_reads_raw_is_refused_by_name(tmp_path):
    # KerasHub's Gemma 4 decoder block multiplies by its FFN layers'
    # `.kernel` directly: quantized, they compute with raw int8 values.
    from keras_vllm.errors import UnsupportedModelError

    causal_lm = testing.build_tiny_causal_lm("gemma4")
    causal_lm.backbone.quantize("int8")
    with pytest.raises(
        UnsupportedModelError, match=r"(gating_ffw|ffw_linear)\.kernel. directly"
    ) as info:
        keras_vllm.export_vllm(
            causal_lm, tmp_path / "artifact", golden_prompts=()
        )
    assert not (tmp_path / "artifact").exists()
    # The filter the message suggests quantizes the rest, and exports
    # (served exactly: tests/serve/test_quantized_serving.py, gemma4-int8).
    raw_read = ("ffw_gating", "ffw_gating_2", "ffw_linear")
    assert str(raw_read) in str(info.value)
    causal_lm = testing.build_tiny_causal_lm("gemma4")
    causal_lm.backbone.quantize(
        "int8", filters=lambda layer: layer.name not in raw_read
    )
    keras_vllm.export_vllm(causal_lm, tmp_path / "int8", golden_prompts=())
    manifest = fmt.read_manifest(tmp_path / "int8")
    assert any("query" in p for p in manifest["quantization"]["layers"])
