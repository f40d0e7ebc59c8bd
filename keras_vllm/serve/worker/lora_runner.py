"""What tpu-inference's runner needs to serve LoRA adapters on our model.

tpu-inference 0.32.0 drives vLLM's LoRA machinery (`--enable-lora`,
`LoRARequest`, `max_loras`) only for torch models: for a flax model its
loader hands the runner no LoRA manager, and the runner's helpers walk
torch modules. These rebindings (pinned to the versions in
`keras_vllm.patching.PINNED_VERSIONS`, checked where the plugin
registers) give a keras-vllm model what the runner expects,
and leave every other model as it was:

* `tpu_inference.models.common.model_loader.get_flax_model`: the returned
  `ModelInterface` carries a `KerasLoraManager` (`serve/worker/lora_manager.py`)
  when LoRA is enabled and the model is `KerasVllmForCausalLM`; otherwise
  the warm-up's `maybe_setup_dummy_loras` fails on
  `assert self.lora_manager is not None` (tpu-inference issue #2207).
* `tpu_inference.runner.lora_utils.LoraUtils.set_active_loras`: the
  original pads the last request's token count to the step's padded
  token count, activates the step's adapters, then rebuilds the runner's
  state from torch modules (`update_lora`); ours does the first two and
  lets the manager write slots into the nnx state and refresh the runner's
  leaves.
* `tpu_inference.runner.lora_utils.LoraUtils.extract_lora_metadata`: the
  original reads a torch punica wrapper; ours returns the manager's
  token->slot int32 array, which the jitted step receives as its
  `lora_metadata` argument (the 7th positional argument `get_flax_model`'s
  step function passes to the model's `__call__`). Its length is the
  step's padded token count, also in the warm-up (vLLM's
  `maybe_select_dummy_loras` maps each warm-up bucket's tokens), so serving
  compiles nothing new.
"""

import dataclasses
import functools

import numpy as np

from keras_vllm import patching


def _is_keras_manager(manager):
    from keras_vllm.serve.worker.lora_manager import KerasLoraManager

    return isinstance(manager, KerasLoraManager)


def _with_lora_manager(original):
    @functools.wraps(original)
    def get_flax_model(vllm_config, *args, **kwargs):
        interface = original(vllm_config, *args, **kwargs)
        from keras_vllm.serve.worker.model import KerasVllmForCausalLM

        lora_config = vllm_config.lora_config
        model = interface.model
        if lora_config is None or not isinstance(model, KerasVllmForCausalLM):
            return interface
        from keras_vllm.serve.worker.lora_manager import KerasLoraManager

        _install_runner_helpers()
        return dataclasses.replace(
            interface, lora_manager=KerasLoraManager(model, lora_config)
        )

    return get_flax_model


def _install_runner_helpers():
    from tpu_inference.runner import lora_utils

    cls = lora_utils.LoraUtils
    patching.replace(cls, "set_active_loras", _setting_our_slots)
    patching.replace(cls, "extract_lora_metadata", _our_token_slots)


def _setting_our_slots(original_set):

    def set_active_loras(self, num_scheduled_tokens_per_req,
                         total_num_scheduled_tokens,
                         padded_total_num_scheduled_tokens):
        runner = self.runner
        manager = getattr(runner, "lora_manager", None)
        if not _is_keras_manager(manager):
            return original_set(
                self, num_scheduled_tokens_per_req,
                total_num_scheduled_tokens, padded_total_num_scheduled_tokens,
            )
        manager.runner = runner
        # Padding tokens belong to the last request, as in the original.
        padded = np.copy(num_scheduled_tokens_per_req)
        padded[-1] += padded_total_num_scheduled_tokens - total_num_scheduled_tokens
        prompt_mapping, token_mapping, requests = (
            runner.input_batch.make_lora_inputs(padded)
        )
        runner._set_active_loras(prompt_mapping, token_mapping, requests)

    return set_active_loras


def _our_token_slots(original_extract):

    def extract_lora_metadata(self):
        manager = getattr(self.runner, "lora_manager", None)
        if self.runner.lora_config is None or not _is_keras_manager(manager):
            return original_extract(self)
        return manager.token_slots

    return extract_lora_metadata


def install():
    """Rebinds tpu-inference's flax model loader (see the module docstring).

    Idempotent; imports no runner module and starts no JAX (the runner
    helpers are rebound when a LoRA-enabled keras-vllm model loads).
    """
    from tpu_inference.models.common import model_loader

    patching.replace(model_loader, "get_flax_model", _with_lora_manager)
