"""Rebuilding a Keras-quantized backbone from an artifact.

The manifest's `quantization` section names each quantized layer's policy
(`int8_from_float32`, `gptq/4/128_from_float32`, ...). The backbone is
built with a `DTypePolicyMap` of exactly those policies, so Keras creates
the same low-precision variables and runs its own quantized computation;
the values then come from the artifact (and, in a delta export, the float
variables of unquantized layers from the preset).

A layer built without a name is numbered by how many of its class the
process built before (`mixtral_sparse_moe_block_21`). An export records
such a layer's path without that number (`fmt.quantization.LayerIndex`
finds the rebuilt layer whatever its number); artifacts written before
recorded the exporting process's numbers, matched here with the number
ignored (`_loose_path`), one recorded layer to one rebuilt layer.
"""

import re

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
    policies = _policy_map_class()(
        dtype, _auto_name_bases(), fmt.quantization.LayerIndex(layers)
    )
    for path, name in layers.items():
        mode = name.rsplit("_from_", 1)[0]
        policies[path] = keras.dtype_policies.get(f"{mode}_from_{dtype}")
    return policies


def _auto_name_bases():
    """The names Keras gives layers built without one, before their number:
    the snake-case name of every `keras.layers.Layer` subclass defined."""
    import keras
    from keras.src.utils.naming import to_snake_case

    seen, stack = set(), [keras.layers.Layer]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    return {to_snake_case(cls.__name__) for cls in seen}


def _loose_path(path, bases):
    """`path` with the number of each auto-named component dropped."""
    parts = []
    for part in path.split("/"):
        base = re.sub(r"_\d+$", "", part)
        parts.append(f"{base}_#" if base in bases else part)
    return "/".join(parts)


def _loose_index(paths, bases):
    """`{loose path: path}` for the loose paths only one of `paths` has."""
    index = {}
    for path in paths:
        index.setdefault(_loose_path(path, bases), []).append(path)
    return {key: found[0] for key, found in index.items() if len(found) == 1}


def comparable_layers(layers):
    """`{path: policy name}` keyed so that two records of one model's
    quantized layers are equal whatever numbers Keras gave its unnamed
    layers (an artifact of another process, a live model, or one that
    recorded the numbers): every such number left out (`_loose_path`)."""
    bases = _auto_name_bases()
    return {_loose_path(path, bases): name for path, name in layers.items()}


def _policy_map_class():
    import keras

    class RecordedPolicies(keras.dtype_policies.DTypePolicyMap):
        """A `DTypePolicyMap` that also finds a recorded layer under
        another auto-number (Keras looks policies up by `layer.path`, at
        every use, so the loose index is built once)."""

        def __init__(self, default_policy, bases, index):
            super().__init__(default_policy=default_policy)
            self._bases = bases
            self._index = index
            self._loose = None

        def __setitem__(self, key, policy):
            super().__setitem__(key, policy)
            self._loose = None

        def __getitem__(self, key):
            if key in self._policy_map:
                return self._policy_map[key]
            recorded = self._index.find(key)
            if recorded in self._policy_map:
                return self._policy_map[recorded]
            # An artifact that recorded the exporting process's numbers.
            if self._loose is None:
                self._loose = _loose_index(self._policy_map, self._bases)
            found = self._loose.get(_loose_path(key, self._bases))
            if found is None:
                return self.default_policy
            return self._policy_map[found]

    return RecordedPolicies


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
    recorded = fmt.quantization.quantized_layers(manifest)
    quantized = weight_io.quantized_layers(backbone)
    index = fmt.quantization.LayerIndex(recorded)
    structural = {index.find(path): path for path in quantized}
    bases = _auto_name_bases()
    loose = _loose_index(quantized, bases)
    built, layers = {}, set()
    for path in recorded:
        found = structural.get(path) or loose.get(_loose_path(path, bases))
        if found is not None:
            built[path] = quantized[found]
            layers.add(found)
    for path in recorded:
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
    extra = sorted(set(quantized) - layers)
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


def fill_from_preset(backbone, preset_backbone, stored):
    """Copies the preset's values into the unquantized, unstored variables.

    A delta export of a quantized model stores every variable of its
    quantized layers; the other variables match the float preset's by
    path (`weights.PathIndex`, the same matching the export used).

    Args:
        backbone: the quantized backbone, built from the artifact's config
            (its quantized layers are the recorded ones: `check_rebuilt`).
        preset_backbone: the float backbone loaded from the preset.
        stored: ids of the variables the artifact stores.
    """
    layers = weight_io.quantized_layers(backbone)
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


def value_problem(name, value):
    """What makes a quantized layer's float variable `name` unusable (a
    phrase), or None: Keras' quantizers write every scale finite and
    non-zero (they add an epsilon), and a non-finite or zero one gives
    non-finite logits at the first call. Integer storage is not judged."""
    import numpy as np

    if np.dtype(value.dtype).kind in "iub":
        return None
    array = np.asarray(value, np.float32)
    if not np.isfinite(array).all():
        return "non-finite values (NaN or infinity)"
    if "scale" in name and (array == 0).any():
        return "zeros (a scale divides or multiplies every value)"
    return None


def check_values(backbone, values):
    """Refuses scale tensors a quantized layer could not compute with
    (`value_problem`; export refuses a model that holds them).

    Args:
        backbone: the backbone built from the artifact (its quantized
            layers are the recorded ones: `check_rebuilt`).
        values: `[(variable, value)]` about to be assigned.

    Raises:
        ArtifactError: naming the variable.
    """
    layers = weight_io.quantized_layers(backbone)
    if not layers:
        return
    for variable, value in values:
        owner, name = variable.path.rsplit("/", 1)
        problem = value_problem(name, value) if owner in layers else None
        if problem is not None:
            raise ArtifactError(
                f"The stored '{variable.path}' of the quantized layer "
                f"'{owner}' holds {problem}; export never writes such a "
                "value. The weights were altered; re-export the model."
            )
