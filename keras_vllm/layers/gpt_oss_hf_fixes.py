"""The fixes keras-hub 0.32's GPT-OSS Hugging Face converter needs.

keras-hub converts a transformers GPT-OSS checkpoint on load
(`keras_hub/src/utils/transformers/convert_gpt_oss.py`). Without these
fixes the converted model is not the one transformers computes:

- Windows: transformers windows the layers its `config.json` lists as
  `"sliding_attention"` in `layer_types` (by default the even ones, layer
  0 first), and a windowed query sees the last `sliding_window` positions,
  itself included (`q - k < sliding_window`). keras-hub's `GptOssBackbone`
  windows the odd layers whatever the checkpoint says, and its
  `GptOssAttention` keeps one position more (`q - k <= sliding_window`).
  Measured on a tiny checkpoint (window 16, an 80-token prompt): the
  argmax agreed with transformers on 32 of 80 positions, logprobs up to
  0.47 apart. The replacement `convert_backbone_config` passes the
  checkpoint's `layer_types` (transformers' default where config.json has
  none) to the backbone, which then windows exactly those layers with
  transformers' count (`backbone_layer_types`). A backbone built without
  `layer_types` (keras-hub presets, models built in Keras) is unchanged.
- YaRN factor: keras-hub takes it only from `rope_scaling` (as the
  published `config.json` of openai/gpt-oss-20b and -120b has it);
  transformers 5 writes the same values as `rope_parameters`. Without
  `rope_scaling` keras-hub builds the backbone with its default factor 1.0:
  every rotary frequency and the attention scale differ from the
  checkpoint's, silently. The replacement reads `rope_parameters` when
  `rope_scaling` is absent.
- Expert weights: keras-hub reads them only in MXFP4 (`*_blocks`,
  `*_scales`, as published). A checkpoint that stores them unquantized (what
  transformers writes for a dequantized fine-tune: `experts.gate_up_proj`)
  made keras-hub fail on a missing tensor; the replacement
  `convert_weights` refuses it by name (`UnsupportedModelError`) instead.

keras-hub's YaRN layer also fixes `beta_fast=32`, `beta_slow=1`,
`original_max_position_embeddings=4096` and `truncate=False` (the published
values), whatever the checkpoint says.

Installed (through `keras_vllm.patching`) as soon as keras-hub imports
`convert_gpt_oss` and `gpt_oss_backbone`
(`keras_vllm.export.keras_hub_hooks`).
"""

import copy
import functools
import inspect

from keras_vllm import patching
from keras_vllm.errors import UnsupportedModelError

# The keras-hub modules these fixes apply to.
KERAS_HUB_MODULE = "keras_hub.src.utils.transformers.convert_gpt_oss"
BACKBONE_MODULE = "keras_hub.src.models.gpt_oss.gpt_oss_backbone"

SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' `GptOssConfig` window, for a config.json without one.
DEFAULT_SLIDING_WINDOW = 128


def checkpoint_layer_types(transformers_config):
    """Each layer's attention kind as transformers reads `config.json`: its
    `layer_types`, else transformers' default (even layers windowed).

    Example:

    ```python
    checkpoint_layer_types({"num_hidden_layers": 3})
    # ["sliding_attention", "full_attention", "sliding_attention"]
    ```
    """
    count = transformers_config["num_hidden_layers"]
    layer_types = transformers_config.get("layer_types")
    if layer_types is None:
        return [SLIDING if i % 2 == 0 else FULL for i in range(count)]
    return list(layer_types)


def layer_windows(layer_types, sliding_window, num_layers):
    """Each layer's `GptOssAttention.sliding_window` (None: global) that
    windows as transformers does: keras-hub's layer keeps keys with
    `q - k <= sliding_window`, transformers' `q - k < sliding_window`.

    Raises:
        UnsupportedModelError: `layer_types` does not name one known kind
            per layer, or names windowed layers whose window keras-hub's
            layer cannot express.

    Example:

    ```python
    layer_windows(["sliding_attention", "full_attention"], 128, 2)
    # [127, None]
    ```
    """
    unknown = sorted(set(layer_types) - {SLIDING, FULL})
    if len(layer_types) != num_layers or unknown:
        raise UnsupportedModelError(
            f"This GPT-OSS checkpoint's 'layer_types' ({len(layer_types)} "
            f"entries{', unknown: ' + str(unknown) if unknown else ''}) must "
            f"name '{SLIDING}' or '{FULL}' for each of its {num_layers} "
            "layers (config.json)."
        )
    windowed = sliding_window is not None and sliding_window > 0
    if windowed and SLIDING in layer_types and sliding_window < 2:
        raise UnsupportedModelError(
            f"This GPT-OSS checkpoint's sliding_window is {sliding_window}: "
            "keras-hub's GptOssAttention cannot keep only the query's own "
            "position. Use a window of 2 or more."
        )
    return [
        sliding_window - 1 if windowed and kind == SLIDING else None
        for kind in layer_types
    ]


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


def _as_transformers_reads_it(original):

    @functools.wraps(original)
    def convert_backbone_config(transformers_config):
        config = original(yarn_as_rope_scaling(transformers_config))
        window = transformers_config.get(
            "sliding_window", DEFAULT_SLIDING_WINDOW
        )
        layer_types = checkpoint_layer_types(transformers_config)
        layer_windows(layer_types, window, config["num_layers"])
        config["sliding_window"] = window
        config["layer_types"] = layer_types
        return config

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


def _windowing_layer_types(original):

    @functools.wraps(original)
    def __init__(self, *args, layer_types=None, **kwargs):
        original(self, *args, **kwargs)
        self.layer_types = None if layer_types is None else list(layer_types)
        if layer_types is None:
            return
        windows = layer_windows(
            self.layer_types, self.sliding_window, self.num_layers
        )
        for decoder, window in zip(self.transformer_layers, windows):
            decoder.sliding_window = window
            decoder.self_attention_layer.sliding_window = window

    # Keras reads a layer's constructor arguments from this signature.
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    keyword = inspect.Parameter(
        "layer_types", inspect.Parameter.KEYWORD_ONLY, default=None
    )
    parameters.insert(len(parameters) - 1, keyword)  # before **kwargs
    __init__.__signature__ = signature.replace(parameters=parameters)
    return __init__


def _with_layer_types(original):

    @functools.wraps(original)
    def get_config(self):
        config = original(self)
        if getattr(self, "layer_types", None) is not None:
            config["layer_types"] = list(self.layer_types)
        return config

    return get_config


def install(module):
    """Fixes keras-hub's GPT-OSS converter `module` (once).

    Args:
        module: the imported
            `keras_hub.src.utils.transformers.convert_gpt_oss`.
    """
    patching.replace(
        module, "convert_backbone_config", _as_transformers_reads_it
    )
    patching.replace(module, "convert_weights", _mxfp4_only)


def install_backbone(module):
    """Lets keras-hub's `GptOssBackbone` take `layer_types` (once): with
    them, layer `i` is windowed iff `layer_types[i]` is
    `"sliding_attention"`, and a window holds `sliding_window` positions,
    the query's own included, as transformers counts them; the config
    returns them. Without them the backbone is keras-hub's.

    Args:
        module: the imported `keras_hub.src.models.gpt_oss.gpt_oss_backbone`.
    """
    backbone = module.GptOssBackbone
    patching.replace(backbone, "__init__", _windowing_layer_types)
    patching.replace(backbone, "get_config", _with_layer_types)
