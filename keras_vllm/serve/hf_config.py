"""The Hugging Face config class vLLM uses to read our `config.json`.

vLLM only accepts a `model_type` that transformers knows, so keras-vllm
registers this class for `keras_vllm` in every vLLM process (see
`keras_vllm/serve/plugin.py`). It is defined at module level so it pickles when
vLLM spawns processes.
"""

from transformers import PretrainedConfig

from keras_vllm import format as fmt


class KerasVllmConfig(PretrainedConfig):
    """The neutral config of a keras-vllm artifact (fields in FORMAT.md)."""

    model_type = fmt.MODEL_TYPE


def register():
    """Registers `KerasVllmConfig` with transformers' `AutoConfig`."""
    from transformers import AutoConfig

    AutoConfig.register(fmt.MODEL_TYPE, KerasVllmConfig, exist_ok=True)


def serves_artifact(model_config):
    """Whether a vLLM `ModelConfig` is a keras-vllm artifact's."""
    hf_config = getattr(model_config, "hf_config", None)
    return getattr(hf_config, "model_type", None) == fmt.MODEL_TYPE
