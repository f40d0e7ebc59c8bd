"""Hostile edits aimed at what serving opened up (issue 40): adapters,
quantized values and the manifest's weights table.

Each edit damages a good artifact's copy as an attacker would, and keeps
the checksums valid (`hostile_edits.rehash_files`), so a deeper check has
to refuse it. `ADAPTER_CASES` start from a LoRA adapter artifact,
`QUANTIZED_VALUE_CASES` from an int8 full export, `MANIFEST_CASES` from any
full export; each maps a name to `(edit, message)`, `message` a regular
expression the keras-vllm error must match.
"""

import json
import os
import shutil

import numpy as np

from keras_vllm import format as fmt
from keras_vllm.hub import checkpoint

from helpers import hostile_edits as edits


def rewrite_stored(d, change):
    """Rewrites the orbax checkpoint with `change({path: array})` applied
    (every array keeps its recorded shape and dtype unless `change`
    alters it), then the file table: only the values tell."""
    manifest = edits.read_manifest(d)
    specs = {
        path: (tuple(spec["shape"]), spec["dtype"])
        for path, spec in manifest["weights"]["variables"].items()
    }
    if manifest["weights"]["mode"] == "adapter":
        specs.update(fmt.adapter.factor_specs(manifest))
    directory = os.path.join(d, fmt.WEIGHTS_DIR)
    arrays = {
        path: np.array(value)
        for path, value in checkpoint.restore_weights(directory, specs).items()
    }
    change(arrays)
    shutil.rmtree(directory)
    checkpoint.save_weights(directory, arrays)
    edits.rehash_files(d)


# -- adapters ---------------------------------------------------------------


def factor_dtype_recorded_otherwise(d):
    """The manifest says bfloat16 factors; float32 ones are stored (the
    start-up checks passed it and the engine died at its first request)."""
    def edit(m):
        m["adapter"]["factor_dtype"] = (
            "float32" if m["adapter"].get("factor_dtype") == "bfloat16"
            else "bfloat16"
        )

    edits.edit(d, edit)
    edits.rehash_files(d)


def factors_stored_in_another_dtype(d):
    """The manifest still says float32; the checkpoint holds float16."""
    def change(arrays):
        for path in list(arrays):
            if path.endswith("lora_kernel_a"):
                arrays[path] = arrays[path].astype(np.float16)

    rewrite_stored(d, change)


def factor_of_another_rank(d):
    """One factor stored with one rank more than recorded."""
    def change(arrays):
        path = sorted(p for p in arrays if p.endswith("lora_kernel_b"))[0]
        b = arrays[path]
        arrays[path] = np.concatenate([b, b[:1]], axis=0)

    rewrite_stored(d, change)


def bias_of_another_shape(d):
    """A changed bias recorded (and stored) with a shape the base's
    variable at its position does not have."""
    def edit(m):
        variables = m["weights"]["variables"]
        if not variables:
            return
        path = sorted(variables)[0]
        variables[path]["shape"] = variables[path]["shape"] + [1]

    edits.edit(d, edit)
    edits.rehash_files(d)


ADAPTER_CASES = {
    "factor_dtype_recorded_otherwise": (
        factor_dtype_recorded_otherwise, r"recorded in the manifest as"
    ),
    "factors_stored_in_another_dtype": (
        factors_stored_in_another_dtype, r"float16"
    ),
    "factor_of_another_rank": (factor_of_another_rank, r"lora_kernel_b"),
}


def base_without_manifest(d, scratch):
    """Points the adapter's base at a directory without a manifest."""
    os.makedirs(scratch, exist_ok=True)
    with open(os.path.join(scratch, "config.json"), "w") as f:
        json.dump({"model_type": "llama"}, f)
    edits.edit(d, lambda m: m["adapter"]["base"].update(path=scratch))
    edits.rehash_files(d)


# -- quantized values ---------------------------------------------------------


def _scales(value):
    def change(arrays):
        path = sorted(p for p in arrays if p.endswith("kernel_scale"))[0]
        scale = arrays[path].copy()
        scale.flat[0] = value
        arrays[path] = scale

    return lambda d: rewrite_stored(d, change)


def layer_norm_listed_as_quantized(d):
    """A layer norm's path added to 'quantization.layers' (it owns stored
    variables, so the manifest alone cannot tell)."""
    def edit(m):
        norm = next(
            p.rsplit("/", 1)[0] for p in sorted(m["weights"]["variables"])
            if "layernorm" in p
        )
        m["quantization"]["layers"][norm] = "int8_from_float32"

    edits.edit(d, edit)
    edits.rehash_files(d)


def _policy(name):
    def mutate(d):
        def edit(m):
            layer = next(p for p in m["quantization"]["layers"] if "query" in p)
            m["quantization"]["layers"][layer] = name

        edits.edit(d, edit)
        edits.rehash_files(d)

    return mutate


QUANTIZED_VALUE_CASES = {
    "zero_scale": (_scales(0.0), r"kernel_scale.*zeros"),
    "nan_scale": (_scales(np.nan), r"kernel_scale.*non-finite"),
    "infinite_scale": (_scales(np.inf), r"kernel_scale.*non-finite"),
    "layer_norm_listed": (
        layer_norm_listed_as_quantized, r"does not quantize"
    ),
    "int4_block_size_0": (_policy("int4/0_from_float32"), r"block size 0"),
    "int4_block_size_minus_5": (
        _policy("int4/-5_from_float32"), r"block size -5"
    ),
    "gptq_5_bits": (_policy("gptq/5/16_from_float32"), r"not 5"),
    "awq_8_bits": (_policy("awq/8/16_from_float32"), r"not 8"),
    "gptq_group_size_0": (_policy("gptq/4/0_from_float32"), r"group size 0"),
}


# -- the manifest's weights table ---------------------------------------------


def weights_bytes_missing(d):
    def edit(m):
        del m["weights"]["bytes"]

    edits.edit(d, edit)


MANIFEST_CASES = {
    "weights_bytes_missing": (weights_bytes_missing, r"'weights\.bytes'"),
}
