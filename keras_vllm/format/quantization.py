"""The manifest's `quantization` section (format 1.2): which layers Keras
quantized, and in which mode.

A Keras-quantized model (`backbone.quantize("int8")`, `"int4"`, `"float8"`,
or a calibrated `causal_lm.quantize("gptq" | "awq", config=...)`) keeps its
low-precision values and their scales as ordinary variables, and each
quantized layer carries a dtype policy whose name spells the mode and its
parameters (`int8_from_float32`, `int4/128_from_float32`,
`gptq/4/128_from_float32`). The section records those names per layer path;
a reader rebuilds the policies from the names alone (never from serialized
classes), and refuses a name it does not parse, so a hostile edit cannot
pick a policy class or a shape Keras would not build.

Example:

```json
"quantization": {
  "layers": {
    "token_embedding": "int8_from_float32",
    "transformer_layer_0/self_attention/query": "int8_from_float32"
  }
}
```
"""

import re

from keras_vllm.errors import ArtifactError
from keras_vllm.format.names import MAX_FILES
from keras_vllm.format.names import SUPPORTED_DTYPES
from keras_vllm.format.names import VARIABLE_PATH_PATTERN

# Storage dtypes only quantized layers hold (int4 values are packed two per
# int8; GPTQ/AWQ store packed unsigned values and zero points).
QUANTIZED_VARIABLE_DTYPES = ("int8", "uint8")

# Keras 3.15's quantized policy names (`keras.dtype_policies`): the mode,
# its numeric parameters, and the float dtype it computes in.
_POLICY = re.compile(
    r"(?P<mode>int8|float8|int4(/-?\d{1,6})?|(gptq|awq)/\d{1,2}/-?\d{1,6})"
    r"_from_(?P<source>[a-z0-9]+)"
)
_LAYER = re.compile(VARIABLE_PATH_PATTERN)
# The weight bits Keras 3.15's GPTQ and AWQ policies accept, and the largest
# block (group) size a reader takes (Keras accepts any positive one).
_BITS = {"gptq": (2, 3, 4, 8), "awq": (4,)}
_MAX_BLOCK = 1 << 16


def _fail(message):
    raise ArtifactError(f"Invalid manifest: {message}")


def parse_policy_name(name):
    """`(mode, source dtype)` of a quantized policy name.

    Args:
        name: a Keras quantized dtype policy name, e.g.
            `"int4/128_from_float32"`.

    Returns:
        `("int4", "float32")`: the base mode (`int8`, `int4`, `float8`,
        `gptq`, `awq`) and the float dtype.

    Raises:
        ArtifactError: if `name` is not such a name.
    """
    found = _POLICY.fullmatch(name) if isinstance(name, str) else None
    if found is None or found["source"] not in SUPPORTED_DTYPES:
        _fail(
            f"'quantization.layers' holds the policy '{str(name)[:80]}', not "
            "a Keras quantized policy name (e.g. 'int8_from_float32', "
            "'int4/128_from_float32', 'gptq/4/128_from_float32')."
        )
    parts = found["mode"].split("/")
    _check_parameters(name, parts[0], [int(p) for p in parts[1:]])
    return parts[0], found["source"]


def _check_parameters(name, mode, numbers):
    """The parameters Keras' policies accept (checked here, so that Keras
    never sees a value it would answer with a bare `ValueError`)."""
    if mode in ("gptq", "awq"):
        bits, size = numbers
        allowed = _BITS[mode]
        if bits not in allowed:
            _fail(
                f"'quantization.layers' holds the policy '{name}': {mode} "
                f"quantizes to {allowed} bits, not {bits}. Re-export the "
                "model."
            )
    else:
        size = numbers[0] if numbers else -1
    if size != -1 and not 0 < size <= _MAX_BLOCK:
        what = "block size" if mode == "int4" else "group size"
        _fail(
            f"'quantization.layers' holds the policy '{name}': its {what} "
            f"{size} is neither -1 (per channel) nor a positive size up to "
            f"{_MAX_BLOCK}. Re-export the model."
        )


def quantized_layers(manifest):
    """`{layer path: policy name}` of the artifact (empty when unquantized)."""
    section = manifest.get("quantization")
    return dict(section["layers"]) if section else {}


def _unnumbered(part):
    return re.sub(r"_\d+$", "", part)


class LayerIndex:
    """Finds the recorded quantized layer that owns a stored variable.

    `weights.variables` keeps each variable's path as the exporting process
    had it (an unnamed layer's name carries Keras' per-process number:
    `mixtral_sparse_moe_block_5`), while `quantization.layers` records
    structural paths, without those numbers (older artifacts recorded the
    numbered paths: found as they are). A layer path owns a variable's
    owner path when each part is equal or is the owner's part without its
    number; exactly one recorded layer must.
    """

    def __init__(self, layers):
        self._exact = set(layers)
        self._loose = {}
        for path in layers:
            key = tuple(_unnumbered(p) for p in path.split("/"))
            self._loose.setdefault(key, []).append(path)

    def find(self, owner):
        """The recorded layer path owning `owner` (a variable's parent
        path), or None."""
        if owner in self._exact:
            return owner
        parts = owner.split("/")
        key = tuple(_unnumbered(p) for p in parts)
        found = [
            path
            for path in self._loose.get(key, ())
            if all(
                r == o or r == _unnumbered(o)
                for r, o in zip(path.split("/"), parts)
            )
        ]
        return found[0] if len(found) == 1 else None


def modes(manifest):
    """`{mode: number of layers}`, e.g. `{"int8": 15}`."""
    counts = {}
    for name in quantized_layers(manifest).values():
        mode = parse_policy_name(name)[0]
        counts[mode] = counts.get(mode, 0) + 1
    return counts


def packing(manifest):
    """`{variable owner path: values per stored element}` of the stored
    variables of packed layers.

    Keras packs 4-bit values two per byte (`int4`, and `gptq`/`awq` at 4
    bits or fewer); every other variable stores one value per element.
    Computed once per check: a manifest may list many variables.
    """
    layers = quantized_layers(manifest)
    packed = set()
    for path, name in layers.items():
        mode = name.rsplit("_from_", 1)[0].split("/")
        bits = 4 if mode[0] == "int4" else int(mode[1]) if len(mode) > 2 else 8
        if bits <= 4:
            packed.add(path)
    if not packed:
        return {}
    index = LayerIndex(layers)
    owners = {p.rsplit("/", 1)[0] for p in manifest["weights"]["variables"]}
    return {owner: 2 for owner in owners if index.find(owner) in packed}


def validate(manifest):
    """Checks the section and that only its layers hold quantized dtypes.

    Called by `validate_manifest()` once the `weights` section is checked.
    """
    section = manifest.get("quantization")
    layers = {}
    if section is not None:
        if not isinstance(section, dict) or set(section) != {"layers"}:
            _fail("'quantization' must be an object with one field, 'layers'.")
        layers = section["layers"]
        if not isinstance(layers, dict) or not 0 < len(layers) <= MAX_FILES:
            _fail(
                "'quantization.layers' must map between 1 and "
                f"{MAX_FILES} layer paths to policy names."
            )
        for path, name in layers.items():
            if not isinstance(path, str) or not _LAYER.fullmatch(path):
                _fail(
                    f"'quantization.layers' names '{str(path)[:100]}', not a "
                    "layer path."
                )
            source = parse_policy_name(name)[1]
            if source != manifest["dtype"]:
                _fail(
                    f"'quantization.layers['{path}']' computes in {source}, "
                    f"but the model's dtype is {manifest['dtype']}."
                )
    variables = manifest["weights"]["variables"]
    index = LayerIndex(layers)
    owners = {path.rsplit("/", 1)[0] for path in variables}
    owned = {index.find(owner) for owner in owners}
    for path in layers:
        # Full and delta exports alike store every variable of a quantized
        # layer, so a listed layer that owns none is not the model's.
        if path not in owned:
            _fail(
                f"'quantization.layers' names '{path}', but the artifact "
                "stores no variable of that layer."
            )
    for path, spec in variables.items():
        if spec["dtype"] not in QUANTIZED_VARIABLE_DTYPES:
            continue
        owner, name = path.rsplit("/", 1)
        if name.endswith("_scale") or name == "g_idx":
            # Scales and GPTQ's group indices are float in every mode.
            _fail(
                f"weights.variables['{path}'] is {spec['dtype']}; Keras "
                f"stores '{name}' in a float dtype."
            )
        if index.find(owner) is None:
            _fail(
                f"weights.variables['{path}'] is {spec['dtype']}, but "
                + (
                    f"its layer '{owner}' is not listed in "
                    "'quantization.layers'."
                    if layers
                    else "the artifact declares no quantization; only "
                    f"quantized layers hold {spec['dtype']} values."
                )
            )
