"""What an adapter export stores: LoRA factors, a delta, the base's name.

A model with LoRA enabled (`backbone.enable_lora(rank)`) exports as an
adapter artifact (`weights="adapter"`, format 1.3) against a base: the
preset it came from or an existing keras-vllm artifact (`base=`). Only
Keras' own factors are stored (per-head A of 3-D attention kernels
included), plus any other variable that differs from the base. The factors
are stored as Keras trains them (float32, exact) unless `lora_dtype=` asks
for bfloat16 or float16 (half the bytes; the factors are rounded, so the
golden outputs are recorded with the rounded values).
"""

import contextlib
import logging
import os
import types

import numpy as np

from keras_vllm import format as fmt
from keras_vllm.hub import presets
from keras_vllm.hub import checkpoint
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ExportError

logger = logging.getLogger("keras_vllm")


def lora_layers(backbone):
    """The backbone's layers with LoRA enabled, in layer order."""
    return [
        layer
        for layer in backbone._flatten_layers(include_self=False, recursive=True)
        if getattr(layer, "lora_enabled", False)
    ]


def wanted(weights, backbone, base, handle):
    """Whether this export writes an adapter artifact.

    `"adapter"` always (refused without LoRA or a base); `"auto"` when LoRA
    is enabled and a base is known.
    """
    has_lora = bool(lora_layers(backbone))
    if weights == "adapter":
        if not has_lora:
            raise ExportError(
                "weights='adapter' needs a model with LoRA enabled "
                "(`causal_lm.backbone.enable_lora(rank)` before fine-tuning)."
            )
        if base is None and handle is None:
            raise ExportError(
                "weights='adapter' needs the base the adapter applies to: "
                "pass `base=` (a keras-vllm artifact directory) or `preset=`."
            )
        return True
    if base is not None and weights != "auto":
        raise ExportError(
            f"`base=` names the base of an adapter export, but weights="
            f"'{weights}'. Use weights='adapter' (or 'auto'), or drop `base=`."
        )
    if base is not None and not has_lora:
        raise ExportError(
            "`base=` is given but the model has no LoRA layers, so there is "
            "no adapter to export. Drop `base=`."
        )
    return weights == "auto" and has_lora and (base is not None or handle)


def check_lora_dtype(lora_dtype):
    """Refuses a `lora_dtype=` that is not a factor dtype of the format,
    before anything is computed or written."""
    if lora_dtype is not None and (
        not isinstance(lora_dtype, str)
        or lora_dtype not in fmt.LORA_FACTOR_DTYPES
    ):
        raise ExportError(
            f"lora_dtype={lora_dtype!r} is not a dtype LoRA factors can be "
            f"stored in; pass one of {fmt.LORA_FACTOR_DTYPES}, or None "
            "(float32, as Keras trains them)."
        )


def check_lora_dtype_applies(lora_dtype, as_adapter, weights):
    """`lora_dtype=` only chooses how an adapter export stores its factors;
    any other export merges them into the kernels at the model's dtype."""
    if lora_dtype is not None and not as_adapter:
        raise ExportError(
            f"lora_dtype={lora_dtype!r} only applies to adapter exports "
            f"(weights='adapter', or 'auto' with a base), but this export "
            f"(weights='{weights}') is not one: it stores the kernels with "
            "the LoRA factors merged, in the model's dtype. Drop lora_dtype, "
            "or export an adapter with `base=` / `preset=`."
        )


def _rounded(value, lora_dtype):
    """A factor's value as stored: float32 rounded to `lora_dtype`."""
    return np.asarray(value, "float32").astype(checkpoint.dtype_of(lora_dtype))


@contextlib.contextmanager
def factors_as_stored(backbone, lora_dtype):
    """Within the block, the model's LoRA factors hold the values the
    artifact stores (rounded to `lora_dtype`, upcast back to float32), so
    golden outputs recorded there are what loading and serving compute.
    The user's exact values are restored afterwards, whatever happens."""
    if lora_dtype in (None, fmt.DEFAULT_LORA_FACTOR_DTYPE):
        yield
        return
    factors = [
        variable
        for layer in lora_layers(backbone)
        for variable in (layer.lora_kernel_a, layer.lora_kernel_b)
    ]
    # Copies: a backend may reuse a variable's buffer on assignment.
    exact = [np.array(v.value) for v in factors]
    try:
        for variable, value in zip(factors, exact):
            variable.assign(_rounded(value, lora_dtype).astype("float32"))
        yield
    finally:
        for variable, value in zip(factors, exact):
            variable.assign(value)


def _raw_values(backbone):
    """`[(path, numpy value)]` of `ordered_variables`, LoRA not merged."""
    return [
        (v.path, np.asarray(v.value))
        for v in weight_io.ordered_variables(backbone)
    ]


def _base_from_artifact(base, target, dtype):
    """The base artifact's reference and its values by position."""
    import keras_hub

    base = os.path.abspath(os.fspath(base))
    opened = fmt.open_artifact(base, verify=True)
    opened.validate()
    manifest = opened.manifest
    if manifest["weights"]["mode"] == "adapter":
        raise ExportError(
            f"The base '{base}' is itself an adapter artifact; pass the full, "
            "delta or preset artifact the adapter applies to."
        )
    if manifest["dtype"] != dtype:
        raise ExportError(
            f"The base '{base}' is {manifest['dtype']}, the model {dtype}; "
            "export the adapter against a base of the model's dtype."
        )
    values = {}
    if manifest["weights"]["mode"] != "full":
        preset = keras_hub.models.Backbone.from_preset(
            manifest["preset"]["handle"], dtype=dtype
        )
        values = dict(enumerate(v for _, v in _raw_values(preset)))
    specs = manifest["weights"]["variables"]
    if specs:
        restored = checkpoint.restore_weights(
            fmt.safe_join(base, fmt.WEIGHTS_DIR),
            {p: (tuple(s["shape"]), s["dtype"]) for p, s in specs.items()},
        )
        for path, spec in specs.items():
            values[spec["index"]] = restored[path]
    reference = {
        "kind": "artifact",
        # Relative to the adapter, so the two can move together.
        "path": os.path.relpath(base, target),
        "manifest_sha256": fmt.manifest_hash(base),
    }
    return reference, manifest["backbone"], values, manifest.get("preset")


def plan(backbone, serialized_backbone, dtype, target, base, handle,
         lora_dtype=None):
    """The adapter export's content.

    Args:
        backbone: the LoRA-enabled backbone.
        serialized_backbone: its manifest `backbone` section.
        dtype: its variable dtype name.
        target: the artifact's final path (a base path is stored relative
            to it).
        base: a keras-vllm artifact directory, or None for `handle`.
        handle: the preset the model came from (used when `base` is None).
        lora_dtype: the dtype the factors are stored in (checked by
            `check_lora_dtype`); None stores them as Keras keeps them,
            float32.

    Returns:
        A namespace: `stored` (`{orbax path: array}`: the delta and the
        factors), `variables` (`{path: index}` of the delta), `adapter`
        (the manifest section), `preset` (the manifest's `preset`).
    """
    import keras_hub

    if base is not None:
        reference, base_section, base_values, preset = _base_from_artifact(
            base, target, dtype
        )
        if base_section["registered_name"] != serialized_backbone[
            "registered_name"
        ] or _strip(base_section["config"]) != _strip(
            serialized_backbone["config"]
        ):
            raise ExportError(
                f"The model's backbone config differs from the base '{base}' "
                "(class or sizes), so it cannot be stored as an adapter of "
                "it. Pass the base the model was fine-tuned from."
            )
        name = base
    else:
        preset = {"handle": handle, "files": presets.hash_preset(handle)}
        reference = {"kind": "preset"}
        base_backbone = keras_hub.models.Backbone.from_preset(handle, dtype=dtype)
        if _strip(base_backbone.get_config()) != _strip(backbone.get_config()):
            raise ExportError(
                f"The model's backbone config differs from the preset "
                f"'{handle}', so it cannot be stored as an adapter of it. "
                "Export with `weights='full'`, or pass the right preset."
            )
        base_values = dict(enumerate(v for _, v in _raw_values(base_backbone)))
        name = handle
    ordered = weight_io.ordered_variables(backbone)
    raw = _raw_values(backbone)
    if len(base_values) != len(raw):
        raise ExportError(
            f"The model has {len(raw)} variables, its base '{name}' "
            f"{len(base_values)}; the model was not fine-tuned from it."
        )
    stored, variables = {}, {}
    for index, (path, value) in enumerate(raw):
        other = base_values[index]
        if other.shape != value.shape:
            raise ExportError(
                f"Variable '{path}' has shape {value.shape} in the model and "
                f"{other.shape} in the base '{name}'; the model was not "
                "fine-tuned from it."
            )
        if not np.array_equal(value, other):
            stored[path] = value
            variables[path] = index
    position = {id(v): i for i, v in enumerate(ordered)}
    factor_dtype = lora_dtype or fmt.DEFAULT_LORA_FACTOR_DTYPE
    targets = {}
    for layer in lora_layers(backbone):
        kernel = layer._kernel
        if id(kernel) not in position:
            raise ExportError(
                f"The LoRA layer '{layer.path}' has no plain kernel among the "
                "backbone's variables; it cannot be exported as an adapter."
            )
        a_path, b_path = fmt.adapter.factor_paths(layer.path)
        if (layer.lora_kernel_a.path, layer.lora_kernel_b.path) != (a_path, b_path):
            raise ExportError(
                f"The LoRA factors of '{layer.path}' are not named "
                f"'{a_path}'/'{b_path}'; this Keras version is not supported "
                "for adapter exports. Use weights='full'."
            )
        targets[layer.path] = {
            "kernel": kernel.path,
            "kernel_index": position[id(kernel)],
            "kernel_shape": list(kernel.shape),
            "rank": int(layer.lora_rank),
            "alpha": layer.lora_alpha,
        }
        stored[a_path] = _rounded(layer.lora_kernel_a.value, factor_dtype)
        stored[b_path] = _rounded(layer.lora_kernel_b.value, factor_dtype)
    if variables:
        logger.warning(
            "keras-vllm: the adapter also stores %d variable(s) that differ "
            "from its base '%s' (e.g. '%s') beside the LoRA factors.",
            len(variables), name, sorted(variables)[0],
        )
    section = {"base": reference, "targets": targets}
    if factor_dtype != fmt.DEFAULT_LORA_FACTOR_DTYPE:
        # Recorded only when it is not the default, so float32 adapters
        # stay readable by 1.3 readers from before the field.
        section["factor_dtype"] = factor_dtype
    return types.SimpleNamespace(
        stored=stored,
        variables=variables,
        adapter=section,
        preset=preset if reference["kind"] == "preset" else None,
    )


def _strip(config):
    return {k: v for k, v in config.items() if k not in ("dtype", "name")}
