"""The `adapter` section of a LoRA adapter artifact (format 1.3; 1.4 adds
`factor_dtype`).

An adapter artifact (`weights.mode == "adapter"`) stores Keras' own LoRA
factors (`lora_kernel_a`, `lora_kernel_b`) of the layers it targets, plus
any other variable that differs from its base, and names that base: a
preset (the manifest's `preset`, pinned by file digests) or another
keras-vllm artifact (pinned by the SHA-256 of its manifest):

```json
"adapter": {
  "base": {"kind": "artifact", "path": "../base",
           "manifest_sha256": "<hex>"},
  "targets": {
    "transformer_layer_0/self_attention/query": {
      "kernel": "transformer_layer_0/self_attention/query/kernel",
      "kernel_index": 3, "kernel_shape": [64, 4, 16],
      "rank": 2, "alpha": 2}
  },
  "factor_dtype": "bfloat16"
}
```

`factor_dtype` (optional; absent means float32, Keras' own dtype for the
factors) is the dtype both factors of every target are stored in. Readers
of format 1.2 refuse the artifact on `weights.mode` (`"adapter"` is not one
of their modes), so none loads the base alone; 1.3 readers (format 1.4
added `factor_dtype`) refuse an artifact that records it (their `adapter` section
holds exactly `base` and `targets`, and their float32 record of a factor
differs from the dtype orbax stored), never reading it as float32.
"""

import math
import re

from keras_vllm.format.checks import fail
from keras_vllm.format.checks import is_int
from keras_vllm.format.checks import is_number
from keras_vllm.format.checks import is_sha256
from keras_vllm.format.names import DEFAULT_LORA_FACTOR_DTYPE
from keras_vllm.format.names import LORA_FACTOR_DTYPES
from keras_vllm.format.names import LORA_FACTORS
from keras_vllm.format.names import MAX_FILES
from keras_vllm.format.names import MAX_LORA_RANK
from keras_vllm.format.names import VARIABLE_PATH_PATTERN

_PATH = re.compile(VARIABLE_PATH_PATTERN)
BASE_KINDS = ("preset", "artifact")


def _bad(message):
    fail(f"Invalid manifest: {message} The manifest was altered; re-export "
         "the adapter.")


def factor_paths(layer_path):
    """The orbax paths of one target's factors: `(a, b)`."""
    return tuple(f"{layer_path}/{name}" for name in LORA_FACTORS)


def factor_shapes(target):
    """`(a_shape, b_shape)` Keras gives a target's factors: A is the
    kernel's shape with its last axis replaced by the rank (one A per head
    of a 3-D attention kernel), B is `(rank, kernel_shape[-1])`."""
    shape, rank = list(target["kernel_shape"]), target["rank"]
    return shape[:-1] + [rank], [rank, shape[-1]]


def stored_paths(manifest):
    """Every path the weights checkpoint holds: the listed variables and,
    in an adapter artifact, each target's two factors."""
    paths = set(manifest["weights"]["variables"])
    for layer in (manifest.get("adapter") or {}).get("targets", {}):
        paths.update(factor_paths(layer))
    return paths


def factor_dtype(manifest):
    """The dtype the factors are stored in: `adapter.factor_dtype`, float32
    when absent (Keras keeps LoRA factors in float32 whatever the model's
    dtype, and artifacts before the field stored them so)."""
    return manifest["adapter"].get("factor_dtype", DEFAULT_LORA_FACTOR_DTYPE)


def factor_specs(manifest):
    """`{orbax path: (shape, dtype)}` of the factors, in their stored
    dtype (`factor_dtype`): the restore checks it against orbax's own
    record and casts nothing."""
    dtype = factor_dtype(manifest)
    specs = {}
    for layer, target in manifest["adapter"]["targets"].items():
        for path, shape in zip(factor_paths(layer), factor_shapes(target)):
            specs[path] = (tuple(shape), dtype)
    return specs


def _check_base(manifest, base):
    if not isinstance(base, dict) or base.get("kind") not in BASE_KINDS:
        _bad(f"'adapter.base.kind' must be one of {BASE_KINDS}.")
    if base["kind"] == "preset":
        if set(base) != {"kind"}:
            _bad("'adapter.base' of kind 'preset' holds only 'kind' (the "
                 "preset is the manifest's 'preset').")
        if manifest.get("preset") is None:
            _bad("'adapter.base.kind' is 'preset' but 'preset' is null.")
        return
    if set(base) != {"kind", "path", "manifest_sha256"}:
        _bad("'adapter.base' of kind 'artifact' must hold exactly 'kind', "
             "'path' and 'manifest_sha256'.")
    path = base["path"]
    if not isinstance(path, str) or not 0 < len(path) < 4096 or "\x00" in path:
        _bad("'adapter.base.path' must be a non-empty path string.")
    if not is_sha256(base["manifest_sha256"]):
        _bad("'adapter.base.manifest_sha256' must be a hex SHA-256.")


def _check_target(layer, target):
    where = f"'adapter.targets[{layer[:200]!r}]'"
    if not isinstance(layer, str) or _PATH.fullmatch(layer) is None:
        _bad(f"{where} is not a Keras layer path.")
    keys = {"kernel", "kernel_index", "kernel_shape", "rank", "alpha"}
    if not isinstance(target, dict) or set(target) != keys:
        _bad(f"{where} must hold exactly {sorted(keys)}.")
    kernel = target["kernel"]
    if not isinstance(kernel, str) or kernel.rsplit("/", 1)[0] != layer:
        _bad(f"{where}.kernel must be a variable of the layer '{layer}'.")
    if _PATH.fullmatch(kernel) is None:
        _bad(f"{where}.kernel must be a Keras variable path.")
    index = target["kernel_index"]
    if not is_int(index) or not 0 <= index < MAX_FILES:
        _bad(f"{where}.kernel_index out of range.")
    shape = target["kernel_shape"]
    if (
        not isinstance(shape, list)
        or not 2 <= len(shape) <= 8
        or not all(is_int(d) and 0 < d < (1 << 24) for d in shape)
        or math.prod(shape) > (1 << 36)
    ):
        _bad(f"{where}.kernel_shape must list 2 to 8 positive dimensions.")
    rank = target["rank"]
    if not is_int(rank) or not 0 < rank <= MAX_LORA_RANK:
        _bad(f"{where}.rank is {str(rank)[:20]}; it must be a positive "
             f"integer no larger than {MAX_LORA_RANK}.")
    alpha = target["alpha"]
    if not is_number(alpha) or not 0 < alpha <= 1e6:
        _bad(f"{where}.alpha must be a positive number.")


def validate(manifest):
    """Checks the `adapter` section against `weights` (structure only).

    Called by `validate_manifest()` once `weights` and `preset` are
    checked; whether the targets exist in the base is checked against the
    base (`check_targets`) when it is opened.

    Raises:
        ArtifactError: naming the field.
    """
    weights = manifest["weights"]
    adapter = manifest.get("adapter")
    is_adapter = weights["mode"] == "adapter"
    lora = weights.get("lora", "merged")
    if is_adapter != (adapter is not None) or is_adapter != (lora == "factors"):
        _bad("'weights.mode' is 'adapter' exactly when the manifest has an "
             "'adapter' section and 'weights.lora' is 'factors'.")
    if not is_adapter:
        return
    if manifest.get("quantization") is not None:
        _bad("an adapter artifact cannot be quantized.")
    if not isinstance(adapter, dict) or not (
        {"base", "targets"} <= set(adapter) <= {"base", "targets",
                                                "factor_dtype"}
    ):
        _bad("'adapter' must hold exactly 'base' and 'targets', and "
             "optionally 'factor_dtype'.")
    dtype = factor_dtype(manifest)
    if not isinstance(dtype, str) or dtype not in LORA_FACTOR_DTYPES:
        _bad(f"'adapter.factor_dtype' is {str(dtype)[:40]!r}; it must be "
             f"one of {LORA_FACTOR_DTYPES}.")
    _check_base(manifest, adapter["base"])
    targets = adapter["targets"]
    if not isinstance(targets, dict) or not 0 < len(targets) <= MAX_FILES:
        _bad("'adapter.targets' must map layer paths to their factors.")
    indices = set()
    for layer, target in targets.items():
        _check_target(layer, target)
        if target["kernel_index"] in indices:
            _bad(f"two targets claim kernel position {target['kernel_index']}.")
        indices.add(target["kernel_index"])


def check_targets(manifest, base_manifest, base_name):
    """The adapter fits its base, checked from the two manifests alone.

    The backbone configs must be equal (same architecture and sizes) and,
    when the base stores every variable, each target kernel must be the
    base's variable at its position, of its shape.

    Raises:
        ArtifactError: naming the kernel and the base.
    """
    if base_manifest["weights"]["mode"] == "adapter":
        fail(f"The adapter's base '{base_name}' is itself an adapter; an "
             "adapter's base must be a full, delta or preset artifact.")
    ours, theirs = manifest["backbone"], base_manifest["backbone"]
    strip = lambda c: {k: v for k, v in c.items() if k not in ("dtype", "name")}
    if ours["registered_name"] != theirs["registered_name"] or strip(
        ours["config"]
    ) != strip(theirs["config"]):
        fail(f"The adapter was trained on another backbone than its base "
             f"'{base_name}' holds (class or config differ). Pass the base "
             "it was exported against.")
    if base_manifest["weights"]["mode"] != "full":
        return
    by_index = {
        spec["index"]: (path, spec["shape"])
        for path, spec in base_manifest["weights"]["variables"].items()
    }
    for layer, target in sorted(manifest["adapter"]["targets"].items()):
        found = by_index.get(target["kernel_index"])
        if found is None or found[0].rsplit("/", 1)[-1] != "kernel" or (
            found[1] != target["kernel_shape"]
        ):
            have = "nothing" if found is None else f"'{found[0]}' {found[1]}"
            fail(f"The adapter targets the kernel '{target['kernel']}' "
                 f"{target['kernel_shape']} at position "
                 f"{target['kernel_index']}, but the base '{base_name}' has "
                 f"{have} there: the base lacks that kernel. Export the "
                 "adapter against this base, or pass its own base.")
