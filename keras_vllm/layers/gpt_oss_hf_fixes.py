"""The fixes keras-hub 0.32's GPT-OSS Hugging Face converter needs.

keras-hub converts a transformers GPT-OSS checkpoint on load
(`keras_hub/src/utils/transformers/convert_gpt_oss.py`). Two gaps:

- YaRN factor: keras-hub takes it only from `rope_scaling` (as the
  published `config.json` of openai/gpt-oss-20b and -120b has it);
  transformers 5 writes the same values as `rope_parameters`. Without
  `rope_scaling` keras-hub builds the backbone with its default factor 1.0:
  every rotary frequency and the attention scale differ from the
  checkpoint's, silently. The replacement `convert_backbone_config` reads
  `rope_parameters` when `rope_scaling` is absent.
- Expert weights: keras-hub reads them only in MXFP4 (`*_blocks`,
  `*_scales`, as published). A checkpoint that stores them unquantized (what
  transformers writes for a dequantized fine-tune: `experts.gate_up_proj`)
  made keras-hub fail on a missing tensor; the replacement
  `convert_weights` refuses it by name (`UnsupportedModelError`) instead.

keras-hub's YaRN layer also fixes `beta_fast=32`, `beta_slow=1`,
`original_max_position_embeddings=4096` and `truncate=False` (the published
values), whatever the checkpoint says; and its window alternation is the
opposite of transformers' (docs/FAMILIES.md, GPT-OSS): keras-vllm serves
the Keras model as converted.

Installed (through `keras_vllm.patching`) as soon as keras-hub imports
`convert_gpt_oss` (`keras_vllm.export.keras_hub_hooks`).
"""

import copy
import functools

from keras_vllm import patching
from keras_vllm.errors import UnsupportedModelError

# The keras-hub module these fixes apply to.
KERAS_HUB_MODULE = "keras_hub.src.utils.transformers.convert_gpt_oss"


def yarn_as_rope_scaling(transformers_config):
    """The config with transformers 5's YaRN `rope_parameters` copied to
    `rope_scaling`, where keras-hub reads the factor (unchanged if it has
    `rope_scaling` already, or no YaRN).

    Example:

    ```python
    yarn_as_rope_scaling({"rope_parameters": {
        "rope_type": "yarn", "factor": 32.0, "rope_theta": 150000.0}})
    # {"rope_parameters": {...}, "rope_scaling": {"rope_type": "yarn",
    #  "factor": 32.0, "rope_theta": 150000.0}}
    ```
    """
    parameters = transformers_config.get("rope_parameters") or {}
    if (
        transformers_config.get("rope_scaling") is not None
        or parameters.get("rope_type") != "yarn"
    ):
        return transformers_config
    config = copy.deepcopy(transformers_config)
    config["rope_scaling"] = dict(parameters)
    return config


def _reading_rope_parameters(original):

    @functools.wraps(original)
    def convert_backbone_config(transformers_config):
        return original(yarn_as_rope_scaling(transformers_config))

    return convert_backbone_config


def _has(loader, key):
    try:
        loader.get_tensor(key)
    except Exception:  # keras-hub raises whatever safetensors raises.
        return False
    return True


def _mxfp4_only(original):

    @functools.wraps(original)
    def convert_weights(backbone, loader, transformers_config):
        experts = "model.layers.0.mlp.experts."
        if not _has(loader, experts + "gate_up_proj_blocks") and _has(
            loader, experts + "gate_up_proj"
        ):
            raise UnsupportedModelError(
                "This GPT-OSS checkpoint stores its expert weights "
                "unquantized ('mlp.experts.gate_up_proj'); keras-hub 0.32 "
                "converts GPT-OSS experts only from MXFP4 "
                "('gate_up_proj_blocks' / '_scales', as openai/gpt-oss-20b "
                "is published). Load the MXFP4 checkpoint, or build the "
                "model in Keras and load the weights there."
            )
        return original(backbone, loader, transformers_config)

    return convert_weights


def install(module):
    """Fixes keras-hub's GPT-OSS converter `module` (once).

    Args:
        module: the imported
            `keras_hub.src.utils.transformers.convert_gpt_oss`.
    """
    patching.replace(
        module, "convert_backbone_config", _reading_rope_parameters
    )
    patching.replace(module, "convert_weights", _mxfp4_only)
