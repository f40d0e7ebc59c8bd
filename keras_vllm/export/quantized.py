"""What an export records of a Keras-quantized backbone.

Keras quantizes in place (`backbone.quantize("int8")`, or a calibrated
`causal_lm.quantize("gptq", config=...)`): each quantized layer gets a
policy naming its mode and low-precision variables plus scales. The export
stores those variables as they are and records the policy names per layer
in the manifest's `quantization` section (`keras_vllm.format.quantization`),
so the loader rebuilds the same layers and the engine runs Keras' own
quantized computation.
"""

import numpy as np

from keras_vllm import format as fmt
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ExportError
from keras_vllm.errors import UnsupportedModelError


def _layer_names(paths):
    # A layer's name is the last part of its path.
    return tuple(sorted({path.rsplit("/", 1)[-1] for path in paths}))


def quantized_layers(backbone, dtype):
    """`{structural layer path: policy name}` of the backbone's quantized
    layers.

    Each path is recorded without the numbers Keras gave the layers it
    named itself (`weights.structural_paths`: Mixtral's router sits in an
    unnamed MoE block), so the section does not depend on what the
    exporting process built before. The name is rebuilt from the policy's
    mode and the model's float dtype: Keras 3.15's
    `DTypePolicyMap.get_config()` (called by every `backbone.get_config()`)
    sets the live policies' names to None.
    """
    from keras_vllm.layers import swap

    raw = swap.raw_kernel_layers(backbone)
    layers = weight_io.quantized_layers(backbone)
    structural = weight_io.structural_paths(backbone)
    found = {}
    for path, layer in layers.items():
        if path in raw:
            parent, name = raw[path]
            raise UnsupportedModelError(
                f"Layer '{path}' is quantized ({layer.quantization_mode}), "
                f"but KerasHub's {parent} multiplies by its `{name}.kernel` "
                "directly instead of calling it, so the quantized values are "
                "used as raw integers and the model's output is wrong in "
                "Keras too. Quantize the other layers only "
                "(`backbone.quantize(mode, filters=lambda layer: layer.name "
                f"not in {_layer_names(raw)})`), "
                "or export the float model."
            )
        if getattr(layer, "lora_enabled", False):
            # Keras computes such a layer as quantized kernel + float LoRA
            # product; merging would re-quantize the sum, and the served
            # model would no longer be the one Keras computes.
            raise UnsupportedModelError(
                f"Layer '{path}' is quantized "
                f"({layer.quantization_mode}) and has LoRA enabled. The "
                "artifact would have to re-quantize the merged kernel, which "
                "changes what the model computes. Fine-tune first (LoRA or "
                "full), merge and save the float model, then quantize it and "
                "export; see docs/QUANTIZATION.md."
            )
        mode = layer.dtype_policy.get_config()["mode"]
        _check_inputs_quantizer(path, layer, mode)
        found[structural[path]] = f"{mode}_from_{dtype}"
    _check_findable(structural, layers, found)
    return found


def _check_findable(structural, layers, found):
    """Every process finds exactly the quantized layers from the recorded
    paths: the loader's lookup (`fmt.quantization.LayerIndex`, blind to
    the numbers of unnamed layers) maps each layer of this backbone to its
    own recorded path, or to none when it is not quantized."""
    index = fmt.quantization.LayerIndex(found)
    for path, key in structural.items():
        want = key if path in layers else None
        if index.find(path) != want:
            raise UnsupportedModelError(
                f"Layer '{path}' and a quantized layer differ only in the "
                "numbers Keras gives unnamed layers (per process), so the "
                "artifact could not tell them apart when loaded. Quantize "
                "one of them only (`quantize(mode, filters=...)`), or export "
                "the float model."
            )


# Whether a layer of each mode quantizes its inputs, as Keras 3.15's
# `quantize(mode)` sets it without a config (and as the loader rebuilds it;
# `keras_vllm.load.quantized.match_inputs_quantizers`). A policy name does
# not say it, so other choices would be served differently than exported.
_QUANTIZES_INPUTS = {"int8": True, "int4": False}


def _check_inputs_quantizer(path, layer, mode):
    mode = mode.split("/", 1)[0]  # "int4/128" -> "int4"
    expected = _QUANTIZES_INPUTS.get(mode)
    actual = getattr(layer, "inputs_quantizer", None) is not None
    if expected is None or actual == expected:
        return
    raise UnsupportedModelError(
        f"Layer '{path}' is quantized as {mode} "
        + ("with its inputs quantized too" if actual else "weights-only")
        + f"; keras-vllm stores {mode} layers as Keras' default config "
        "makes them ("
        + ("inputs quantized per token" if expected else "weights only")
        + f"). Quantize with `quantize('{mode}')` and no custom "
        "activation quantizer."
    )


def section(backbone, dtype):
    """The manifest's `quantization` section, or None for a float model."""
    layers = quantized_layers(backbone, dtype)
    return {"layers": layers} if layers else None


def check_values(backbone, weights):
    """Refuses a quantized layer whose float values (scales, zero points)
    the loader would refuse (`keras_vllm.load.quantized.value_problem`):
    the quantized model computes non-finite logits in Keras too.

    Args:
        backbone: the backbone being exported.
        weights: its `{variable path: array}`.
    """
    from keras_vllm.load.quantized import value_problem

    layers = weight_io.quantized_layers(backbone)
    for path, value in weights.items() if layers else ():
        owner, name = path.rsplit("/", 1)
        problem = value_problem(name, value) if owner in layers else None
        if problem is not None:
            raise UnsupportedModelError(
                f"Variable '{path}' of the quantized layer '{owner}' holds "
                f"{problem}, so the model's outputs are not finite. Quantize "
                "a model whose weights are finite."
            )


# Modes whose served tokens and logprobs are tested equal to Keras'; awq and
# float8 are untested, and exported for Keras-side use only.
SERVED_MODES = ("int8", "int4", "gptq")


def check_servable(section_value):
    """Raises `UnsupportedModelError` for a mode the engine does not serve
    exactly (the exporter's conformance gate turns it into an unservable
    artifact when the caller allows one)."""
    if not section_value:
        return
    for path, name in section_value["layers"].items():
        mode = fmt.quantization.parse_policy_name(name)[0]
        if mode not in SERVED_MODES:
            raise UnsupportedModelError(
                f"Layer '{path}' is quantized as '{name}'; keras-vllm serves "
                f"{', '.join(SERVED_MODES)} token for token, and {mode} is "
                "not verified equal to Keras on the engine yet. Quantize with "
                "'int8', 'int4' or 'gptq' to serve it."
            )


def neutral_backbone_config(serialized, dtype):
    """Replaces the backbone config's `DTypePolicyMap` with the plain policy.

    The per-layer policies live in the `quantization` section as names; the
    config keeps only the backbone's own float policy, so no Keras object
    beyond the allowlisted plain policies is ever deserialized on load.
    """
    import keras

    config = dict(serialized["config"])
    config["dtype"] = keras.dtype_policies.serialize(keras.DTypePolicy(dtype))
    return {**serialized, "config": config}


def delta(weights, quantized, base_weights):
    """The variables a delta export of a quantized model stores.

    Args:
        weights: `{path: array}` of the quantized backbone.
        quantized: the quantized layers' paths (as the live backbone has
            them).
        base_weights: `{path: array}` of the float preset's backbone.

    Returns:
        Every variable of a quantized layer (a quantized layer always
        differs from its float preset) and the other variables whose values
        differ from the preset's, matched by path (`weights.PathIndex`).
    """
    base_index = weight_io.PathIndex(base_weights.items())
    stored = {}
    for path, value in weights.items():
        if path.rsplit("/", 1)[0] in quantized:
            stored[path] = value
            continue
        base = base_index.get(path)
        if base is None or base.shape != value.shape:
            raise ExportError(
                f"Variable '{path}' of the quantized model has no single "
                "counterpart in the float preset, so the model cannot be "
                "stored as a delta. Export with `weights='full'`."
            )
        if not np.array_equal(value, base):
            stored[path] = value
    return stored
