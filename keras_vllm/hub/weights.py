"""A backbone's weights keyed by Keras `Variable.path`.

Keras paths (`transformer_layer_0/self_attention/query/kernel`) are stable
across processes and NNX on/off, unlike NNX state paths, so they are the
interchange key; `keras_vllm.hub.checkpoint` stores them with orbax.
"""

import re

import numpy as np

from keras_vllm.errors import ArtifactError


def _lora_merged_kernels(backbone):
    """Maps `id(kernel variable)` to its LoRA-merged value, for LoRA layers."""
    merged = {}
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        if getattr(layer, "lora_enabled", False):
            # The `kernel` property returns `kernel + alpha/rank * A @ B`.
            merged[id(layer._kernel)] = layer.kernel
    return merged


# Keras' LoRA factors, and the adapter slots a multi-adapter engine adds
# to its served projections (`keras_vllm.layers.common.lora_slots`): neither is a
# model variable of the artifact.
_LORA_VARIABLES = (
    "lora_kernel_a", "lora_kernel_b",
    "lora_slots_a", "lora_slots_b", "lora_slots_scale", "lora_slots_bias",
)


def _is_lora_factor(variable):
    return variable.path.rsplit("/", 1)[-1] in _LORA_VARIABLES


def ordered_variables(backbone):
    """The backbone's variables in their (deterministic) order, LoRA factors
    excluded. A variable's position here is its `index` in the manifest."""
    return [v for v in backbone.weights if not _is_lora_factor(v)]


def canonical_path(path):
    """A variable path without Keras' per-process auto-numbering.

    Layers that KerasHub does not name explicitly get names such as
    `mixtral_sparse_moe_block_3`, numbered by how many were built before in
    the process, so the same variable can have another path in another
    process. Stripping trailing `_<n>` from every component gives a name to
    compare a model with its preset by (the export side; loading checks
    paths more strictly, with `VariableMatcher`).
    """
    return "/".join(re.sub(r"(_\d+)+$", "", part) for part in path.split("/"))


class PathIndex:
    """Finds a counterpart by path in another backbone's `{path: value}`.

    The exact path first (explicitly named layers, e.g.
    `transformer_layer_0/...`, have the same path in every process), else
    the single entry with the same `canonical_path` (an auto-numbered
    layer); None when there is no single match.
    """

    def __init__(self, items):
        self._exact = dict(items)
        self._canonical = {}
        for path, value in self._exact.items():
            self._canonical.setdefault(canonical_path(path), []).append(value)

    def get(self, path):
        if path in self._exact:
            return self._exact[path]
        found = self._canonical.get(canonical_path(path), [])
        return found[0] if len(found) == 1 else None


def auto_named_layers(backbone):
    """Names of the backbone's layers that Keras numbered itself.

    A layer built without a name is called after its class in snake case,
    numbered by how many such layers the process built before
    (`einsum_dense`, `einsum_dense_3`); KerasHub's own names
    (`transformer_layer_0`, `ffw_gating_2`) are not of that form.
    """
    from keras.src.utils.naming import to_snake_case

    names = set()
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        base = re.escape(to_snake_case(type(layer).__name__))
        if re.fullmatch(base + r"(_\d+)?", layer.name):
            names.add(layer.name)
    return names


def _auto_base(name):
    return re.sub(r"_\d+$", "", name)


class VariableMatcher:
    """Matches manifest entries to the rebuilt backbone's variables.

    By position (`index` into `ordered_variables`), checked against the
    recorded path: components must be equal, except the name of a layer
    Keras numbered itself, which may carry another number, but one number
    per layer: within one parent, an artifact's name maps to exactly one
    rebuilt layer and back.

    Example:

    ```python
    matcher = VariableMatcher(backbone, ordered_variables(backbone))
    variable = matcher.match("transformer_layer_0/.../kernel", 3)
    ```
    """

    def __init__(self, backbone, ordered):
        self.ordered = ordered
        self.auto = auto_named_layers(backbone)
        self._to_target = {}
        self._to_artifact = {}

    def match(self, path, index):
        """The variable at `index`, checked against `path`.

        Raises:
            ArtifactError: if the position is out of range or holds another
                variable.
        """
        variables = self.ordered
        if not isinstance(index, int) or not 0 <= index < len(variables):
            raise ArtifactError(
                f"Variable '{path}' has index {index!r}, outside the "
                f"backbone's {len(variables)} variables."
            )
        variable = variables[index]
        recorded = path.split("/")
        actual = variable.path.split("/")
        mismatch = len(recorded) != len(actual)
        for i, (a, t) in enumerate(zip(recorded, actual)):
            if mismatch:
                break
            if t in self.auto:
                parent = "/".join(actual[:i])
                if _auto_base(a) != _auto_base(t):
                    mismatch = True
                elif self._to_target.setdefault((parent, a), t) != t or (
                    self._to_artifact.setdefault((parent, t), a) != a
                ):
                    raise ArtifactError(
                        f"The artifact numbers the layer '{parent}/{t}' "
                        "inconsistently (two recorded names for one layer, "
                        f"or one name for two, e.g. '{path}' at position "
                        f"{index}). The manifest was altered; re-export the "
                        "model."
                    )
            elif a != t:
                mismatch = True
        if mismatch:
            raise ArtifactError(
                f"The artifact stores variable '{path}' at position {index}, "
                f"where the rebuilt backbone has '{variable.path}'."
            )
        return variable


def quantized_layers(backbone):
    """`{layer path: layer}` of the backbone's Keras-quantized layers."""
    return {
        layer.path: layer
        for layer in backbone._flatten_layers(include_self=False, recursive=True)
        if getattr(layer, "quantization_mode", None) is not None
    }


def structural_paths(backbone):
    """`{layer path: structural path}` of every layer of the backbone.

    A layer's structural path is its path with the number Keras gave each
    layer it named itself left out (`transformer_layer_0/
    mixtral_sparse_moe_block_5/sparse_feedforward_gate_dense` becomes
    `transformer_layer_0/mixtral_sparse_moe_block/
    sparse_feedforward_gate_dense`): the same in every process, whatever
    the process built before. Two layers can share one (two sibling layers
    of one class, both unnamed).
    """
    auto = auto_named_layers(backbone)
    found = {}
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        path = getattr(layer, "path", None)
        if path:
            found[path] = "/".join(
                _auto_base(part) if part in auto else part
                for part in path.split("/")
            )
    return found


def backbone_values(backbone):
    """`(variable, value)` in `ordered_variables` order, LoRA merged.

    The values are the backend's arrays, where they lie (no host copy): a
    running engine takes a live model's weights from here.
    """
    merged = _lora_merged_kernels(backbone)
    return [
        (variable, merged.get(id(variable), variable.value))
        for variable in ordered_variables(backbone)
    ]


def backbone_weights(backbone):
    """Returns `{variable.path: numpy array}` with LoRA adapters merged, in
    `ordered_variables` order.

    LoRA factors are folded into their kernels (as keras-hub's own
    `save_to_preset` does) so the result loads into the plain backbone.
    """
    weights = {}
    for variable, value in backbone_values(backbone):
        if variable.path in weights:
            raise ArtifactError(
                f"Two variables of the backbone have the path "
                f"'{variable.path}', and keras-vllm stores each variable "
                "under its path. A KerasHub layer created them outside its "
                "parent layer's name scope; `import keras_vllm` fixes the "
                "KerasHub layers known to do so "
                "(keras_vllm/layers/keras_hub_fixes.py) for models built "
                "after it. Import keras_vllm before building or loading the "
                "model."
            )
        weights[variable.path] = np.asarray(value)
    return weights
