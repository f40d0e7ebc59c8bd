"""keras-vllm's fixes of keras-hub's Gemma 4 and GPT-OSS converters.

`keras_vllm/layers/gemma4_hf_fixes.py` and `gpt_oss_hf_fixes.py`: the
config forms transformers 5 writes convert as the published forms do, the
published forms convert as before, and what keras-hub cannot convert is
refused by name. Serving converted checkpoints exactly:
tests/serve/test_hf_presets_serving.py.
"""

import pytest

import keras_vllm  # noqa: F401  (installs the fixes on keras-hub's import)
from helpers import hf_checkpoints
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers import gemma4_hf_fixes
from keras_vllm.layers import gpt_oss_hf_fixes

_GEMMA4_TEXT = {
    "model_type": "gemma4_text",
    "vocab_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "head_dim": 8,
    "sliding_window": 16,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "attention_k_eq_v": True,
    "hidden_size_per_layer_input": 0,
}


def _gemma4_backbone_config(config):
    from keras_hub.src.utils.transformers import convert_gemma4

    return convert_gemma4.convert_backbone_config(config)


def test_gemma4_per_layer_config_converts_like_the_published_keys():
    written = dict(
        _GEMMA4_TEXT,
        per_layer_config={"5": {"head_dim": 16, "num_key_value_heads": 1}},
    )
    published = dict(
        _GEMMA4_TEXT, global_head_dim=16, num_global_key_value_heads=1
    )
    converted = _gemma4_backbone_config(written)
    assert converted["global_head_dim"] == 16
    assert converted["num_global_key_value_heads"] == 1
    assert converted == _gemma4_backbone_config(published)
    # The caller's dict is left as it was.
    assert "global_head_dim" not in written


def test_gemma4_kv_head_override_only_where_keys_are_values():
    # transformers applies `num_key_value_heads` of per_layer_config only
    # with attention_k_eq_v (E2B/E4B-like: no K=V, same KV heads).
    text = dict(
        _GEMMA4_TEXT,
        attention_k_eq_v=False,
        per_layer_config={"5": {"head_dim": 16}},
    )
    assert gemma4_hf_fixes.global_attention_overrides(text) == {
        "global_head_dim": 16
    }
    # Nested under text_config (Gemma4ForConditionalGeneration) too.
    converted = _gemma4_backbone_config(
        {"model_type": "gemma4", "text_config": dict(
            _GEMMA4_TEXT, per_layer_config={"5": {"head_dim": 16}}
        )}
    )
    assert converted["global_head_dim"] == 16


def test_gemma4_global_layers_of_different_shapes_are_refused():
    text = dict(
        _GEMMA4_TEXT,
        per_layer_config={"2": {"head_dim": 16}, "5": {"head_dim": 32}},
    )
    with pytest.raises(UnsupportedModelError, match="per_layer_config"):
        gemma4_hf_fixes.global_attention_overrides(text)


def test_gemma4_text_checkpoint_needs_no_processor_config(tmp_path):
    from keras_hub.src.utils.transformers import convert_gemma4

    assert convert_gemma4.load_video_converter_config(
        str(tmp_path), _GEMMA4_TEXT
    ) is None
    assert convert_gemma4.load_preprocessor_config(
        str(tmp_path), _GEMMA4_TEXT
    ) == {}
    # A multimodal checkpoint still needs the file, as keras-hub says.
    with pytest.raises(FileNotFoundError):
        convert_gemma4.load_preprocessor_config(
            str(tmp_path), {"model_type": "gemma4", "vision_config": {}}
        )


def test_gpt_oss_yarn_factor_from_rope_parameters():
    from keras_hub.src.utils.transformers import convert_gpt_oss

    base = {
        "vocab_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2,
        "num_local_experts": 4, "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5, "sliding_window": 16, "head_dim": 64,
    }
    yarn = {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 4096,
            "truncate": False}
    transformers_5 = dict(
        base, rope_parameters=dict(yarn, rope_theta=150000.0)
    )
    published = dict(base, rope_theta=150000.0, rope_scaling=yarn)
    converted = convert_gpt_oss.convert_backbone_config(transformers_5)
    assert converted["rope_scaling_factor"] == 8.0
    assert converted == convert_gpt_oss.convert_backbone_config(published)


def test_gpt_oss_unquantized_experts_refused_by_name(tmp_path):
    from keras_vllm.export.capabilities import preset_causal_lm_class

    directory = hf_checkpoints.write_checkpoint(
        "gpt_oss", str(tmp_path / "dense"), published=False
    )
    with pytest.raises(UnsupportedModelError, match="MXFP4"):
        preset_causal_lm_class(directory).from_preset(directory)


def test_converter_fixes_are_installed():
    from keras_hub.src.utils.transformers import convert_gemma4
    from keras_hub.src.utils.transformers import convert_gpt_oss

    from keras_vllm import patching

    for function in (
        convert_gemma4.convert_backbone_config,
        convert_gemma4.load_video_converter_config,
        convert_gemma4.load_preprocessor_config,
        convert_gpt_oss.convert_backbone_config,
        convert_gpt_oss.convert_weights,
    ):
        assert patching.is_replacement(function), function
