"""Rebuilding a Keras-quantized backbone from an artifact.

The manifest's `quantization` section names each quantized layer's policy
(`int8_from_float32`, `gptq/4/128_from_float32`, ...). The backbone is
built with a `DTypePolicyMap` of exactly those policies, so Keras creates
the same low-precision variables and runs its own quantized computation;
the values then come from the artifact (and, in a delta export, the float
variables of unquantized layers from the preset).
"""

from keras_vllm import format as fmt
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError


def policy_map(manifest, dtype):
    """The `keras.DTypePolicyMap` to build the backbone with, or None.

    Args:
        manifest: a validated manifest.
        dtype: the float dtype to build in (the exported one unless the
            caller asked for another); quantized layers compute in it.
    """
    import keras

    layers = fmt.quantization.quantized_layers(manifest)
    if not layers:
        return None
    policies = keras.dtype_policies.DTypePolicyMap(default_policy=dtype)
    for path, name in layers.items():
        mode = name.rsplit("_from_", 1)[0]
        policies[path] = keras.dtype_policies.get(f"{mode}_from_{dtype}")
    return policies


def _quantizable(layer):
    """Whether Keras quantizes layers of this class (its dense and
    embedding layers; any other takes a quantized policy and fails at its
    first call)."""
    import keras

    return isinstance(
        layer,
        (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Embedding),
    )


def check_rebuilt(backbone, manifest):
    """The rebuilt backbone quantizes exactly the recorded layers, each one
    of a class Keras can quantize."""
    layers = fmt.quantization.quantized_layers(manifest)
    built = weight_io.quantized_layers(backbone)
    for path in layers:
        if path not in built:
            raise ArtifactError(
                f"The artifact's 'quantization.layers' names '{path}', which "
                "the rebuilt backbone has no quantizable layer at. The "
                "manifest was altered or written for another model; "
                "re-export it."
            )
        if not _quantizable(built[path]):
            raise ArtifactError(
                f"The artifact's 'quantization.layers' names '{path}', a "
                f"{type(built[path]).__name__}, which Keras does not quantize "
                "(only its Dense, EinsumDense and Embedding layers). The "
                "manifest was altered; re-export the model."
            )
    extra = sorted(set(built) - set(layers))
    if extra:
        raise ArtifactError(
            f"The rebuilt backbone quantizes '{extra[0]}', which the "
            "artifact does not list. Re-export the model."
        )


def match_inputs_quantizers(backbone):
    """Rebuilt int4 layers compute weights-only, as the exported ones did.

    `quantize("int4")` without a config (Keras 3.15) quantizes every layer
    weights-only (`Int4QuantizationConfig`'s default), and export refuses
    int4 layers that quantize their inputs. A layer rebuilt from an int4
    policy gets no config, and `ReversibleEmbedding` then quantizes the
    output head's inputs to int8 per token: logits ~0.03 off the exported
    model's.
    """
    for layer in weight_io.quantized_layers(backbone).values():
        if layer.quantization_mode == "int4":
            layer.inputs_quantizer = None


def mark_calibrated(backbone):
    """Marks GPTQ/AWQ layers calibrated once their values are restored.

    Keras sets the flag in `load_own_variables`; the loader assigns
    variables directly, and an uncalibrated layer would compute with its
    float path instead of the restored quantized values.
    """
    for layer in weight_io.quantized_layers(backbone).values():
        if layer.quantization_mode == "gptq":
            layer.is_gptq_calibrated = True
        elif layer.quantization_mode == "awq":
            layer.is_awq_calibrated = True


def fill_from_preset(backbone, manifest, preset_backbone, stored):
    """Copies the preset's values into the unquantized, unstored variables.

    A delta export of a quantized model stores every variable of its
    quantized layers; the other variables match the float preset's by
    path (`weights.PathIndex`, the same matching the export used).

    Args:
        backbone: the quantized backbone, built from the artifact's config.
        manifest: its validated manifest.
        preset_backbone: the float backbone loaded from the preset.
        stored: ids of the variables the artifact stores.
    """
    layers = fmt.quantization.quantized_layers(manifest)
    base = weight_io.PathIndex(
        (v.path, v) for v in weight_io.ordered_variables(preset_backbone)
    )
    for variable in weight_io.ordered_variables(backbone):
        if id(variable) in stored:
            continue
        if variable.path.rsplit("/", 1)[0] in layers:
            raise ArtifactError(
                f"The artifact lacks variable '{variable.path}' of a "
                "quantized layer (a delta export stores all of them). "
                "Re-export the model."
            )
        found = base.get(variable.path)
        if found is None or tuple(found.shape) != tuple(variable.shape):
            raise IntegrityError(
                f"The preset has no single variable matching "
                f"'{variable.path}' of the quantized backbone."
            )
        variable.assign(found.value)


def check_values(manifest, values):
    """Refuses scale tensors a quantized layer could not compute with.

    Keras writes every scale finite and non-zero (its quantizers add an
    epsilon), and every other float value of a quantized layer finite; a
    zero or non-finite one would give non-finite logits at the first call.

    Args:
        manifest: the validated manifest.
        values: `[(variable, value)]` about to be assigned.

    Raises:
        ArtifactError: naming the variable.
    """
    import numpy as np

    layers = fmt.quantization.quantized_layers(manifest)
    if not layers:
        return
    for variable, value in values:
        owner, name = variable.path.rsplit("/", 1)
        # Integer storage (int8, packed int4, uint8) holds no scale.
        if owner not in layers or np.dtype(value.dtype).kind in "iub":
            continue
        array = np.asarray(value, np.float32)
        problem = None
        if not np.isfinite(array).all():
            problem = "non-finite values (NaN or infinity)"
        elif "scale" in name and (array == 0).any():
            problem = "zeros (a scale divides or multiplies every value)"
        if problem is not None:
            raise ArtifactError(
                f"The stored '{variable.path}' of the quantized layer "
                f"'{owner}' holds {problem}; Keras never writes such a "
                "value. The weights were altered; re-export the model."
            )
