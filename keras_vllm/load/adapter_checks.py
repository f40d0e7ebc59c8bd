"""Whether an adapter artifact can be served per request over a base engine.

`KerasVllmEngine.from_export(base, adapters=...)` runs these checks in the
caller's process before vLLM starts, `keras-vllm serve`'s adapter route
(`serve/frontend/adapters.py`) before vLLM's `/v1/load_lora_adapter`, and the
engine's LoRA manager again in vLLM's worker before it reads an adapter's
factors (an adapter can also arrive later, by path, in a vLLM
`LoRARequest`). They are complete: besides the manifests, the shapes and
dtypes orbax stored for the factors and biases are compared with the
manifest and the base (from the checkpoint's array headers, read with
tensorstore: no array is read), so nothing about an accepted adapter can
fail later inside a scheduled step. None of them starts JAX's backend.
"""

import types

from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import ServingError
from keras_vllm.load.opening import open_verified

# KerasHub's `Backbone.default_lora_layer_names()` (keras-hub 0.32), used
# when a backbone class's own list cannot be asked without an instance.
_DEFAULT_TARGETS = ("query_dense", "value_dense", "query", "value")


def check_base_digest(path, base_path, reference, fix):
    """Refuses a base artifact whose manifest is not the one the adapter
    at `path` records (`reference`: its manifest's `adapter.base`).

    Raises:
        IntegrityError: naming both digests, the field, and `fix`.
    """
    digest = fmt.manifest_hash(base_path)
    if digest != reference["manifest_sha256"]:
        raise IntegrityError(
            f"The base '{base_path}' is not the artifact the adapter '{path}' "
            f"was exported against (it records another base): the base's "
            f"manifest hashes to {digest[:12]}..., the adapter records "
            f"{reference['manifest_sha256'][:12]}... "
            f"('adapter.base.manifest_sha256'). {fix}"
        )

def target_names(base_manifest):
    """The layer names a base serves adapters on: its backbone class's
    `default_lora_layer_names()`, the layers `backbone.enable_lora(rank)`
    fine-tunes."""
    from keras_vllm.hub import classes

    try:
        cls = classes.resolve(
            base_manifest["backbone"]["registered_name"], "backbone"
        )
        config = types.SimpleNamespace(**base_manifest["backbone"]["config"])
        return tuple(cls.default_lora_layer_names(config))
    except Exception:  # the class needs more of an instance: Keras' default
        return _DEFAULT_TARGETS


def _tokenizer(manifest):
    """What tokenizes requests: the tokenizer's class, config (but its
    layer name, which Keras numbers per process) and asset files."""
    tokenizer = manifest["tokenizer"]
    config = {k: v for k, v in tokenizer["config"].items() if k != "name"}
    assets = {
        name: record.get("sha256")
        for name, record in manifest["files"].items()
        if name.startswith(fmt.TOKENIZER_DIR + "/assets/")
    }
    return tokenizer.get("class_name"), config, assets


def open_adapter(path, public_key=None):
    """Opens and verifies an adapter artifact.

    Returns:
        The opened `keras_vllm.format.Artifact`.

    Raises:
        ServingError: the artifact is not an adapter.
    """
    with progress.verbosity(False):
        opened = open_verified(path, public_key=public_key)
    manifest = opened.manifest
    if manifest["weights"]["mode"] != "adapter":
        raise ServingError(
            f"'{path}' is not a LoRA adapter artifact (its 'weights.mode' is "
            f"'{manifest['weights']['mode']}'). Export one with "
            "`causal_lm.export_vllm(path, weights='adapter', base=...)`."
        )
    return opened


def check_adapter(adapter, base, max_rank, names=None):
    """Refuses an adapter that does not fit the served base.

    Args:
        adapter: the opened, verified adapter `keras_vllm.format.Artifact`
            (`open_adapter`).
        base: the served base's opened `keras_vllm.format.Artifact`.
        max_rank: the engine's `max_lora_rank`.
        names: the layer names the engine serves adapters on (defaults to
            `target_names(base_manifest)`).

    Raises:
        IntegrityError: the adapter was exported against another base.
        ArtifactError: it targets a kernel the base lacks or does not serve
            adapters on.
        ServingError: its rank exceeds `max_rank`, or it changes variables
            other than its LoRA factors.

    Example:

    ```python
    adapter_checks.check_adapter(
        adapter_checks.open_adapter("exports/support"),
        keras_vllm.format.open_artifact("exports/base"),
        max_rank=8,
    )
    ```
    """
    path, manifest = adapter.path, adapter.manifest
    base_path, base_manifest = base.path, base.manifest
    reference = manifest["adapter"]["base"]
    if reference["kind"] == "artifact":
        check_base_digest(
            path, base_path, reference, "Serve it over its own base."
        )
    elif (
        base_manifest["weights"]["mode"] != "preset"
        or base_manifest.get("preset") != manifest.get("preset")
    ):
        raise IntegrityError(
            f"The adapter '{path}' applies to the preset "
            f"{(manifest.get('preset') or {}).get('handle')!r} ('adapter.base'"
            f" of kind 'preset'), which the served '{base_path}' is not. "
            "Serve it over an export of that preset."
        )
    fmt.adapter.check_targets(manifest, base_manifest, base_path)
    if _tokenizer(manifest) != _tokenizer(base_manifest):
        raise ServingError(
            f"The adapter '{path}' has another tokenizer than the served base "
            f"'{base_path}' ('tokenizer' and its files differ); requests are "
            "tokenized by the base's. Serve it alone: "
            "`KerasVllmEngine.from_export(path)`."
        )
    targets = manifest["adapter"]["targets"]
    # A target's bias (Keras' `enable_lora` leaves it trainable) is served
    # per request with the factors; any other changed variable is not.
    others = sorted(
        v for v in manifest["weights"]["variables"]
        if not v.endswith("/bias") or v.rsplit("/", 1)[0] not in targets
    )
    if others:
        raise ServingError(
            f"The adapter '{path}' also changes {len(others)} variables "
            f"besides its LoRA factors and their layers' biases (e.g. "
            f"'{others[0]}' in 'weights.variables'), which cannot be applied "
            "per request. Serve it alone: `KerasVllmEngine.from_export(path)`."
        )
    check_stored(adapter, base)
    names = target_names(base_manifest) if names is None else names
    for layer, target in sorted(manifest["adapter"]["targets"].items()):
        if layer.rsplit("/", 1)[-1] not in names:
            raise ArtifactError(
                f"The adapter '{path}' targets '{layer}' "
                "('adapter.targets'), but the engine serves adapters only on "
                f"the layers named {sorted(names)} (the backbone's "
                "`default_lora_layer_names()`). Fine-tune with "
                "`backbone.enable_lora(rank)`, or serve it alone."
            )
        if target["rank"] > max_rank:
            raise ServingError(
                f"The adapter '{path}' has rank {target['rank']} on '{layer}' "
                f"('adapter.targets[...].rank'), above the engine's "
                f"max_lora_rank={max_rank}. Start the engine with "
                f"max_lora_rank >= {target['rank']}."
            )


def check_stored(adapter, base):
    """The stored factors and biases are what the manifest records, and the
    biases have the base's shapes (`adapter`, `base`: opened artifacts).

    Raises:
        ArtifactError: naming the variable, the recorded and the stored
            dtype and shape.
    """
    from keras_vllm.hub import checkpoint

    path, manifest = adapter.path, adapter.manifest
    base_path, base_manifest = base.path, base.manifest
    variables = manifest["weights"]["variables"]
    specs = dict(fmt.adapter.factor_specs(manifest))
    specs.update(
        {p: (tuple(s["shape"]), s["dtype"]) for p, s in variables.items()}
    )
    try:
        checkpoint.check_stored_arrays(
            adapter.file(fmt.WEIGHTS_DIR), specs, without_jax=True
        )
    except ArtifactError as e:
        raise ArtifactError(f"The adapter '{path}' is damaged: {e}") from None
    if base_manifest["weights"]["mode"] != "full":
        return
    by_index = {
        spec["index"]: (name, spec["shape"])
        for name, spec in base_manifest["weights"]["variables"].items()
    }
    for name, spec in sorted(variables.items()):
        found = by_index.get(spec["index"])
        if found is None or found[1] != spec["shape"]:
            have = "nothing" if found is None else f"{found[1]}"
            raise ArtifactError(
                f"The adapter '{path}' changes '{name}' {spec['shape']} "
                f"('weights.variables'), but the base '{base_path}' has "
                f"{have} at its position. The adapter does not fit this "
                "base; serve it over its own."
            )
