"""The fixes keras-hub 0.32's Gemma 4 Hugging Face converter needs.

keras-hub converts a transformers Gemma 4 checkpoint on load
(`keras_hub/src/utils/transformers/convert_gemma4.py`). Two gaps make it
fail on checkpoints that transformers 5 itself writes (a fine-tune saved
with `save_pretrained`, a text-only `Gemma4ForCausalLM`):

- Head size and KV heads of the global layers: the published `config.json`
  files carry `global_head_dim` and `num_global_key_value_heads`;
  transformers >= 5.19 writes neither but a `per_layer_config`
  (`{"5": {"head_dim": 512, "num_key_value_heads": 2}, ...}`, one entry per
  full-attention layer). keras-hub reads only the first form, so it builds
  global layers with the local head size and the load dies in a reshape
  ("cannot reshape array of size ... into shape ..."). The replacement
  `convert_backbone_config` fills the two keys from `per_layer_config`
  when they are absent (keras-hub supports one global shape: different
  overrides per layer are refused by name).
- `processor_config.json`: keras-hub reads it for the video converter and
  the preprocessor even when the checkpoint has no vision or audio tower,
  and a text-only checkpoint has none: `FileNotFoundError`. The
  replacements return "no video converter" / "no extra preprocessor
  arguments" for a text-only checkpoint without that file, as keras-hub
  already does for the image and audio converters.

Installed (through `keras_vllm.patching`) as soon as keras-hub imports
`convert_gemma4` (`keras_vllm.export.keras_hub_hooks`), so
`keras_hub.models.CausalLM.from_preset(directory)` works after
`import keras_vllm`, in the export process and where the engine rebuilds
the base of a delta artifact. Checkpoints keras-hub already reads convert
exactly as before.
"""

import copy
import functools

from keras_vllm import patching
from keras_vllm.errors import UnsupportedModelError

# The keras-hub module these fixes apply to.
KERAS_HUB_MODULE = "keras_hub.src.utils.transformers.convert_gemma4"

PROCESSOR_CONFIG = "processor_config.json"


def _text_config(transformers_config):
    if transformers_config.get("model_type") == "gemma4_text":
        return transformers_config
    return transformers_config.get("text_config", transformers_config)


def global_attention_overrides(text_config):
    """`{"global_head_dim": ..., "num_global_key_value_heads": ...}` as the
    published configs write them, read from transformers 5's
    `per_layer_config` (empty if the config has none).

    Args:
        text_config: the text part of a Gemma 4 `config.json`, as a dict.

    Returns:
        The keys to add (only those `text_config` lacks).

    Example:

    ```python
    global_attention_overrides({
        "layer_types": ["sliding_attention", "full_attention"],
        "attention_k_eq_v": True,
        "per_layer_config": {"1": {"head_dim": 512, "num_key_value_heads": 2}},
    })
    # {"global_head_dim": 512, "num_global_key_value_heads": 2}
    ```
    """
    per_layer = text_config.get("per_layer_config") or {}
    if not per_layer:
        return {}
    overrides = {
        (o.get("head_dim"), o.get("num_key_value_heads"))
        for o in per_layer.values()
    }
    if len(overrides) != 1:
        raise UnsupportedModelError(
            "This Gemma 4 checkpoint's per_layer_config gives its layers "
            f"different shapes ({sorted(map(str, overrides))}); keras-hub's "
            "Gemma4Backbone has one head size and KV-head count for all "
            "global layers. Write 'global_head_dim' (and "
            "'num_global_key_value_heads') in config.json if they are one."
        )
    (head_dim, kv_heads), = overrides
    added = {}
    if "global_head_dim" not in text_config and head_dim is not None:
        added["global_head_dim"] = head_dim
    # transformers applies the KV-head override only where keys equal
    # values; keras-hub ties K=V to `num_global_key_value_heads` being set.
    if (
        "num_global_key_value_heads" not in text_config
        and kv_heads is not None
        and text_config.get("attention_k_eq_v", False)
    ):
        added["num_global_key_value_heads"] = kv_heads
    return added


def _from_per_layer_config(original):

    @functools.wraps(original)
    def convert_backbone_config(transformers_config):
        added = global_attention_overrides(_text_config(transformers_config))
        if added:
            transformers_config = copy.deepcopy(transformers_config)
            _text_config(transformers_config).update(added)
        return original(transformers_config)

    return convert_backbone_config


def _without_processor_config(empty):

    def make(original):

        @functools.wraps(original)
        def load(preset, transformers_config):
            from keras_hub.src.utils.preset_utils import check_file_exists

            # keras-hub's own tests for an image and an audio tower.
            multimodal = "vision_config" in transformers_config or (
                transformers_config.get("audio_config")
            )
            if not multimodal and not check_file_exists(
                preset, PROCESSOR_CONFIG
            ):
                return empty
            return original(preset, transformers_config)

        return load

    return make


def install(module):
    """Fixes keras-hub's Gemma 4 converter `module` (once).

    Args:
        module: the imported
            `keras_hub.src.utils.transformers.convert_gemma4`.
    """
    patching.replace(
        module, "convert_backbone_config", _from_per_layer_config
    )
    patching.replace(
        module, "load_video_converter_config", _without_processor_config(None)
    )
    patching.replace(
        module, "load_preprocessor_config", _without_processor_config({})
    )
