"""vLLM entry points (declared in pyproject.toml).

- `platform_plugin` (`vllm.platform_plugins`): on a machine without a TPU,
  selects tpu-inference's platform on JAX CPU devices (the CPU backend);
  on a TPU it returns None and vLLM's own detection runs.
- `register` (`vllm.general_plugins`): runs in every vLLM process; it
  registers the `keras_vllm` config type, the `KerasVllmForCausalLM`
  architecture and the `keras_vllm` tokenizer mode, and applies the CPU
  backend's patches where there is no TPU.

Neither function initializes JAX: vLLM forks its engine process after
loading plugins, and a JAX runtime started before a fork aborts the child.
"""

import os


def platform_plugin():
    """Returns tpu-inference's platform class path on a CPU-only host."""
    from keras_vllm.cpu import detect

    return detect.platform_class_path()


def register():
    """Registers keras-vllm's config, model and tokenizer with vLLM."""
    from keras_vllm import _env  # noqa: F401

    os.environ.setdefault("KERAS_BACKEND", "jax")
    from keras_vllm.cpu import detect

    if detect.is_cpu_host():
        from keras_vllm.cpu import apply_patches

        apply_patches()

    from keras_vllm import artifact
    from keras_vllm.load import hf_config

    hf_config.register()

    from keras_vllm.load.vllm_tokenizer import register as register_tokenizer

    register_tokenizer()

    from tpu_inference.models.common.model_loader import register_model

    from keras_vllm.load.vllm_model import KerasVllmForCausalLM

    register_model(artifact.ARCHITECTURE, KerasVllmForCausalLM)
