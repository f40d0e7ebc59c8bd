"""Adapter artifact -> the base backbone with its LoRA factors.

Everything that can be refused from the manifests alone (the base is the
recorded one, it holds the same backbone, it has every target kernel) is
refused before the base is built; the targets are checked again against
the built base before any of the adapter's weights is read.
"""

import os

import numpy as np

from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.hub import checkpoint
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.load import adapter_checks
from keras_vllm.load import rebuild
from keras_vllm.load.opening import open_verified


def is_adapter(manifest):
    return manifest["weights"]["mode"] == "adapter"


def base_path(artifact, base=None):
    """The recorded base artifact's directory (None for a preset base).

    Args:
        artifact: the opened adapter `keras_vllm.format.Artifact`.
        base: a directory to use instead of the recorded path (a moved
            copy); it must hold the recorded artifact.
    """
    reference = artifact.manifest["adapter"]["base"]
    if reference["kind"] != "artifact":
        return None
    if base is None:
        base = reference["path"]
        if not os.path.isabs(base):
            base = os.path.join(artifact.path, base)
    return os.path.normpath(os.path.abspath(os.fspath(base)))


def open_base(artifact, base=None, verify=True):
    """Opens and checks the base artifact against the adapter's reference.

    Args:
        artifact: the opened adapter `keras_vllm.format.Artifact`.
        base: a directory to use instead of the recorded path.
        verify: whether to hash the base's files.

    Returns:
        The opened base `keras_vllm.format.Artifact`, or None for a preset
        base (checked by the preset loader against its pinned digests).

    Raises:
        IntegrityError: the base is not the recorded one.
        ArtifactError: it does not fit the adapter (another backbone, a
            missing target kernel).
    """
    path, manifest = artifact.path, artifact.manifest
    directory = base_path(artifact, base)
    if directory is None:
        return None
    reference = manifest["adapter"]["base"]
    if not os.path.isdir(directory):
        raise ArtifactError(
            f"The adapter '{path}' applies to the base artifact "
            f"'{directory}' ('adapter.base.path'), which does not exist. "
            "Put the base there, or pass its directory as `base=`."
        )
    adapter_checks.check_base_digest(
        path, directory, reference, "Pass the adapter's own base."
    )
    opened_base = open_verified(directory, verify=verify)
    fmt.adapter.check_targets(manifest, opened_base.manifest, directory)
    return opened_base


def _base_backbone(artifact, dtype, preset, base):
    opened_base = open_base(artifact, base)
    if opened_base is not None:
        if is_adapter(opened_base.manifest):
            raise ArtifactError(
                f"The base '{opened_base.path}' of the adapter "
                f"'{artifact.path}' is itself an adapter; an adapter applies "
                "to a model artifact. Export the base model with "
                "weights='full' (or against its preset)."
            )
        return rebuild.build_model_backbone(
            opened_base, dtype=dtype, preset=preset
        )
    # A preset base: the preset branch of `build_model_backbone`, with none
    # of the adapter's own weights.
    manifest = artifact.manifest
    as_preset = dict(manifest, weights=dict(manifest["weights"], mode="preset",
                                            variables={}))
    return rebuild.build_model_backbone(
        fmt.Artifact(artifact.path, as_preset), dtype=dtype, preset=preset
    )


def target_layers(backbone, manifest):
    """`{layer path: (layer, kernel variable)}`, matched by position."""
    ordered = weight_io.ordered_variables(backbone)
    matcher = weight_io.VariableMatcher(backbone, ordered)
    owners = {}
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        kernel = getattr(layer, "_kernel", None)
        if kernel is not None:
            owners[id(kernel)] = layer
    found = {}
    for layer_path, target in sorted(manifest["adapter"]["targets"].items()):
        try:
            kernel = matcher.match(target["kernel"], target["kernel_index"])
        except ArtifactError as e:
            raise ArtifactError(
                f"The adapter targets a kernel the base lacks: {e}"
            ) from None
        layer = owners.get(id(kernel))
        if (
            layer is None
            or not hasattr(layer, "enable_lora")
            or tuple(kernel.shape) != tuple(target["kernel_shape"])
            or getattr(layer, "quantization_mode", None) is not None
        ):
            raise ArtifactError(
                f"The adapter targets '{target['kernel']}' "
                f"{target['kernel_shape']}, but the base's variable there is "
                f"'{kernel.path}' {list(kernel.shape)}, not a float kernel of "
                "a layer Keras can apply LoRA to. The adapter does not fit "
                "this base."
            )
        found[layer_path] = (layer, kernel)
    return found


def build_adapter_backbone(artifact, dtype=None, preset=None, base=None,
                           merge=False):
    """The base backbone with the adapter applied.

    Args:
        artifact: the opened, verified adapter `keras_vllm.format.Artifact`.
        dtype: variable dtype; defaults to the exported one.
        preset: where a preset base is loaded from instead of its handle.
        base: the base artifact's directory instead of the recorded one.
        merge: fold the factors into the kernels (serving) instead of
            enabling LoRA with them (training can resume).

    Returns:
        A `keras_hub.models.Backbone`.
    """
    manifest = artifact.manifest
    dtype = dtype or manifest["dtype"]
    backbone = _base_backbone(artifact, dtype, preset, base)
    layers = target_layers(backbone, manifest)
    variables, specs = rebuild.matched_specs(backbone, manifest, dtype)
    factor_specs = fmt.adapter.factor_specs(manifest)
    with progress.phase("restoring the adapter", total=manifest["weights"][
            "bytes"], unit="bytes") as phase:
        # One restore of the whole tree: orbax refuses a partial one.
        restored = checkpoint.restore_weights(
            artifact.file(fmt.WEIGHTS_DIR), {**specs, **factor_specs}
        )
        phase.advance(manifest["weights"]["bytes"])
    # Keras keeps LoRA factors in float32; factors stored in bfloat16 or
    # float16 (`adapter.factor_dtype`) upcast to it exactly.
    factors = {p: restored[p].astype(np.float32) for p in factor_specs}
    for variable, value in rebuild.cast_values(variables, restored):
        variable.assign(value)
    targets = manifest["adapter"]["targets"]
    if merge:
        for layer_path, (layer, kernel) in layers.items():
            a_path, b_path = fmt.adapter.factor_paths(layer_path)
            target = targets[layer_path]
            # Keras' own merge (`EinsumDense.kernel` with LoRA enabled):
            # kernel + alpha / rank * A @ B, in float32, cast to the kernel.
            update = np.matmul(factors[a_path], factors[b_path])
            merged = np.asarray(kernel.value, "float32") + (
                target["alpha"] / target["rank"]
            ) * update
            kernel.assign(merged.astype(kernel.dtype))
        return backbone
    backbone.trainable = True
    for layer in backbone._flatten_layers(include_self=False):
        layer.trainable = False
    for layer_path, (layer, _) in layers.items():
        target = targets[layer_path]
        layer.trainable = True
        layer.enable_lora(target["rank"], lora_alpha=target["alpha"])
        a_path, b_path = fmt.adapter.factor_paths(layer_path)
        layer.lora_kernel_a.assign(factors[a_path])
        layer.lora_kernel_b.assign(factors[b_path])
    ranks = {t["rank"] for t in targets.values()}
    if len(ranks) == 1:
        # What `Backbone.enable_lora` records, for `save_lora_weights`.
        backbone._lora_rank = ranks.pop()
        weighted = [lyr for lyr in backbone._flatten_layers(include_self=False)
                    if lyr.weights]
        chosen = {id(layer) for layer, _ in layers.values()}
        backbone._lora_enabled_layers = [
            i for i, lyr in enumerate(weighted) if id(lyr) in chosen
        ]
    return backbone
