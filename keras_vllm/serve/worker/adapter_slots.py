"""Adapter slots for the served backbone of a LoRA-enabled engine.

With vLLM's `enable_lora`, every layer `backbone.enable_lora(rank)` would
fine-tune (the backbone's `default_lora_layer_names()`) gets
`max_loras + 1` zeroed adapter slots (`keras_vllm.layers.common.lora_slots`),
before the variables are placed on the mesh; the engine's LoRA manager
fills them per step.
"""

import logging

import jax.numpy as jnp

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common import lora_slots

logger = logging.getLogger("keras_vllm")


def install_adapter_slots(backbone, lora_config, dtype):
    """Installs slots on the backbone's LoRA target layers.

    Args:
        backbone: the built backbone (paged layers swapped in).
        lora_config: vLLM's `LoRAConfig`, or None (no slots).
        dtype: the served dtype.

    Returns:
        How many projections got slots (0 without LoRA).

    Raises:
        UnsupportedModelError: LoRA is enabled but no layer can take slots.
    """
    if lora_config is None:
        return 0
    names = set(backbone.default_lora_layer_names())
    layers = [
        layer for layer in backbone._flatten_layers(include_self=False)
        if layer.name in names and hasattr(layer, "enable_lora")
        and lora_slots.unsupported_reason(layer) is None
    ]
    if not layers:
        raise UnsupportedModelError(
            f"{type(backbone).__name__} has no float Dense/EinsumDense layer "
            f"named {sorted(names)} to serve LoRA adapters on."
        )
    for layer in layers:
        lora_slots.install_slots(
            layer, int(lora_config.max_loras), int(lora_config.max_lora_rank),
            dtype,
        )
    logger.info(
        "keras-vllm: %d projections take LoRA adapters (%d slots, rank <= %d)",
        len(layers), lora_config.max_loras, lora_config.max_lora_rank,
    )
    return len(layers)


def token_slots(lora_metadata, num_tokens):
    """The step's token->slot array, fitted to its `num_tokens` tokens.

    The runner hands the array at the step's padded token count; any other
    length (a caller outside the runner's buckets) is cut or padded with
    slot 0 (no adapter), so the projection always gets one slot per token.
    """
    if lora_metadata is None:
        return None
    slots = jnp.asarray(lora_metadata, jnp.int32)
    if slots.shape[0] >= num_tokens:
        return slots[:num_tokens]
    return jnp.pad(slots, (0, num_tokens - slots.shape[0]))
