"""The Hugging Face config class vLLM uses to read our `config.json`.

vLLM only accepts a `model_type` that transformers knows, so keras-vllm
registers this class for `keras_vllm` in every vLLM process (see
`keras_vllm/serve/plugin.py`). It is defined at module level so it pickles
when vLLM spawns processes.

An assistant artifact's config (`install`): vLLM 0.32 reads `speculative_config={"method": "mtp", "model": PATH}` into
a draft `ModelConfig` whose `hf_config` it passes through
`SpeculativeConfig.hf_config_override`; it keeps `method: "mtp"` only for a
draft `model_type` among its MTP types, and tpu-inference's runner shares
the target's KV caches with the drafter's layers only when
`SpeculativeConfig.use_gemma4_mtp()`, which is that `model_type` being
`"gemma4_mtp"` (`runner/kv_cache_manager.py::get_kv_cache_spec`; the
proposer then also holds each draft step at the verified token's position).
That is the one cross-model, KV-sharing MTP path vLLM and tpu-inference
have, so an assistant artifact's config (neutral `model_type`, architecture
`KerasVllmAssistantForCausalLM`: `keras_vllm.format.assistant`) is given
that `model_type` in memory, in every vLLM process; its architecture stays
keras-vllm's, so tpu-inference builds keras-vllm's drafter class
(`serve/worker/assistant_model.py`), never its own.
"""

from transformers import PretrainedConfig

from keras_vllm import format as fmt
from keras_vllm import patching
from keras_vllm.format import assistant as assistant_format


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


# The draft model type vLLM and tpu-inference 0.32 key cross-model
# KV-sharing MTP drafting on.
KV_SHARING_MTP_MODEL_TYPE = "gemma4_mtp"


def is_assistant_config(hf_config):
    """Whether a vLLM `hf_config` is a keras-vllm assistant artifact's."""
    architectures = getattr(hf_config, "architectures", None) or ()
    return (
        getattr(hf_config, "model_type", None)
        in (fmt.MODEL_TYPE, KV_SHARING_MTP_MODEL_TYPE)
        and assistant_format.ASSISTANT_ARCHITECTURE in architectures
    )


def install():
    """Wraps vLLM's draft config override (idempotent; keras-vllm's vLLM
    plugin calls it in every vLLM process)."""
    from vllm.config import speculative

    patching.replace(
        speculative.SpeculativeConfig, "hf_config_override", _with_assistants
    )


# vLLM's own override, which `hf_config_override` calls for every other
# config (set by `install`).
_ORIGINAL = []


def hf_config_override(hf_config):
    """vLLM's draft config override, giving an assistant artifact's config
    the MTP model type. Module-level: vLLM pickles it with the draft's
    `ModelConfig` (its `hf_overrides`) into the engine process."""
    if is_assistant_config(hf_config):
        hf_config.model_type = KV_SHARING_MTP_MODEL_TYPE
        return hf_config
    if not _ORIGINAL:
        install()
    return _ORIGINAL[0](hf_config)


def _with_assistants(original):
    _ORIGINAL[:] = [getattr(original, "__func__", original)]
    return staticmethod(hf_config_override)
