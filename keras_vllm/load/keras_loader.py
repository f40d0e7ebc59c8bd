"""Artifact -> Keras: rebuild the `CausalLM` (training side, no vLLM)."""

import os

import numpy as np

from keras_vllm import format as fmt
from keras_vllm import classes
from keras_vllm import presets
from keras_vllm import progress
from keras_vllm import reference
from keras_vllm import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.load.class_checks import check_config_keys
from keras_vllm.load.class_checks import resolve_classes
from keras_vllm.load import adapter
from keras_vllm.load import quantized
from keras_vllm.load.opening import open_verified


def _config(manifest, role):
    section = manifest[role]
    config = dict(section["config"])
    fmt.configs.check_config_values(config, f"{role}.config")
    return classes.resolve(section["registered_name"], role), config


def _safe_mode():
    """Keras' safe mode for deserialization (no lambdas; keras-hub
    tokenizers refuse asset paths from a config). Keras exposes it only as
    a `safe_mode=` argument of its loaders, not as a public scope."""
    from keras.src.saving.serialization_lib import SafeModeScope

    return SafeModeScope(True)


def _construct(cls, config, role):
    """`cls.from_config(config)` in Keras' safe mode, with any failure as
    an `ArtifactError`."""
    try:
        with _safe_mode():
            return cls.from_config(config)
    except Exception as e:  # Keras and keras-hub raise many types
        raise ArtifactError(
            f"The artifact's {role} config does not build a {cls.__name__} "
            f"({type(e).__name__}: {str(e)[:300]}). The manifest was altered "
            "or written by another keras-hub; re-export the model."
        ) from None


def _same_config(a, b):
    strip = lambda c: {k: v for k, v in c.items() if k not in ("dtype", "name")}
    return strip(a) == strip(b)


def build_backbone(path, manifest, dtype=None, preset=None, base=None,
                   merge_lora=False):
    """Rebuilds the backbone with the artifact's weights.

    Args:
        path: artifact directory (already verified).
        manifest: its validated manifest.
        dtype: variable dtype to build in; defaults to the exported one.
        preset: a local directory or handle to use instead of the recorded
            preset reference (its files must hash to the recorded values).
        base: an adapter artifact's base directory, instead of the
            recorded path (it must be the recorded artifact).
        merge_lora: for an adapter artifact, fold its LoRA factors into the
            kernels (serving) instead of enabling LoRA with them.

    Returns:
        A `keras_hub.models.Backbone`.
    """
    import keras_hub

    if adapter.is_adapter(manifest):
        return adapter.build_adapter_backbone(
            path, manifest, dtype=dtype, preset=preset, base=base,
            merge=merge_lora,
        )

    cls, config = _config(manifest, "backbone")
    dtype = dtype or manifest["dtype"]
    weights = manifest["weights"]
    mode = weights["mode"]
    policies = quantized.policy_map(manifest, dtype)
    preset_backbone = None
    if mode == "full":
        with progress.phase(f"building {cls.__name__}"):
            backbone = _construct(
                cls, {**config, "dtype": policies or dtype}, "backbone"
            )
    else:
        handle = preset or manifest["preset"]["handle"]
        with progress.phase(f"loading preset '{handle}'"):
            presets.check_preset(
                handle, manifest["preset"]["files"], manifest["backbone"]
            )
            backbone = keras_hub.models.Backbone.from_preset(
                handle, dtype=dtype
            )
        if type(backbone) is not cls or not _same_config(
            backbone.get_config(), config
        ):
            raise IntegrityError(
                f"The preset '{handle}' holds a different backbone than the "
                "one this artifact was exported from."
            )
        if policies is not None:
            # The preset is float; its values fill the unquantized layers.
            preset_backbone = backbone
            with progress.phase(f"building quantized {cls.__name__}"):
                backbone = _construct(
                    cls, {**config, "dtype": policies}, "backbone"
                )
    if policies is not None:
        quantized.check_rebuilt(backbone, manifest)
        quantized.match_inputs_quantizers(backbone)
    values = stored_values(backbone, path, manifest, dtype)
    for variable, value in values:
        variable.assign(value)
    if preset_backbone is not None:
        quantized.fill_from_preset(
            backbone, manifest, preset_backbone, {id(v) for v, _ in values}
        )
    if policies is not None:
        quantized.mark_calibrated(backbone)
    return backbone


def stored_values(backbone, path, manifest, dtype=None):
    """The artifact's stored weights, matched to `backbone`'s variables.

    Args:
        backbone: a backbone of the artifact's architecture (built from
            its config, or one already serving).
        path: the artifact directory (already verified).
        manifest: its validated manifest.
        dtype: the dtype the values are cast to; defaults to the exported
            one.

    Returns:
        `[(variable, value)]` for every stored variable (all of them in a
        full export), values in the variables' dtypes.

    Raises:
        ArtifactError: when an entry does not match its variable.
    """
    dtype = dtype or manifest["dtype"]
    weights = manifest["weights"]
    mode = weights["mode"]
    variables, specs = matched_specs(backbone, manifest, dtype)
    if specs:
        directory = fmt.safe_join(path, fmt.WEIGHTS_DIR)
        with progress.phase(
            f"restoring {mode} weights", total=weights["bytes"], unit="bytes"
        ) as phase:
            restored = weight_io.restore_weights(directory, specs)
            values = cast_values(variables, restored)
            phase.advance(sum(v.nbytes for _, v in values))
            return values
    return []


def cast_values(variables, restored):
    """`[(variable, value)]` for the restored `{path: array}` of matched
    `variables`, cast only when the caller asked for another dtype."""
    values = []
    for var_path, variable in variables.items():
        value = restored[var_path]
        if str(value.dtype) != variable.dtype:
            value = value.astype(variable.dtype)
        values.append((variable, value))
    return values


def matched_specs(backbone, manifest, dtype):
    """`({path: variable}, {path: (shape, dtype)})` of the stored variables,
    each checked against the backbone's variable at its position."""
    weights = manifest["weights"]
    mode = weights["mode"]
    ordered = weight_io.ordered_variables(backbone)
    matcher = weight_io.VariableMatcher(backbone, ordered)
    variables = {}
    specs = {}
    for var_path, spec in weights["variables"].items():
        # Matched by position (paths of auto-named layers differ between
        # processes); the path must agree up to that auto-numbering.
        target = matcher.match(var_path, spec["index"])
        variables[var_path] = target
        if tuple(target.shape) != tuple(spec["shape"]):
            raise ArtifactError(
                f"Variable '{var_path}' has shape {tuple(spec['shape'])} in "
                f"the artifact but {tuple(target.shape)} in the backbone."
            )
        if dtype == manifest["dtype"] and spec["dtype"] != target.dtype:
            # Built in the exported dtype, every stored variable has its
            # variable's dtype; a differing record is refused, not cast.
            raise ArtifactError(
                f"Variable '{var_path}' is recorded as {spec['dtype']} but "
                f"the backbone built in {manifest['dtype']} holds it as "
                f"{target.dtype}. The manifest was altered; re-export the "
                "model."
            )
        specs[var_path] = (tuple(spec["shape"]), spec["dtype"])
    if mode == "full" and len(specs) != len(ordered):
        stored = {id(v) for v in variables.values()}
        missing = [v.path for v in ordered if id(v) not in stored]
        raise ArtifactError(
            f"The artifact is a full export but lacks variable "
            f"'{(missing or ['?'])[0]}'."
        )
    return variables, specs


def load_tokenizer(path, manifest=None):
    """Rebuilds the artifact's native KerasHub tokenizer (offline).

    Returns:
        A `keras_hub.tokenizers.Tokenizer` with its assets loaded.
    """
    if manifest is None:
        manifest = open_verified(path).manifest
    section = manifest["tokenizer"]
    cls, config = _config(manifest, "tokenizer")
    assets = fmt.safe_join(path, fmt.TOKENIZER_ASSETS_DIR)
    names = section.get("assets")
    if not isinstance(names, list) or sorted(os.listdir(assets)) != sorted(
        names
    ):
        raise ArtifactError(
            "The tokenizer assets on disk differ from those the manifest lists."
        )
    fmt.references.check_asset_fields(config, "tokenizer.config")
    check_config_keys(cls, config, "tokenizer")
    tokenizer = _construct(cls, config, "tokenizer")
    try:
        # Outside safe mode: keras-hub's `load_assets` passes the assets'
        # own (confined, verified) paths, which safe mode refuses.
        tokenizer.load_assets(assets)
    except Exception as e:  # tokenizer libraries raise many types
        raise ArtifactError(
            f"The tokenizer assets could not be loaded ({type(e).__name__}: "
            f"{str(e)[:200]})."
        ) from None
    _check_vocabulary_size(tokenizer, manifest)
    for probe in section.get("golden", []):
        # `tokenize`, not `tokenizer(...)`: a Keras layer call would start
        # JAX, and vLLM loads the tokenizer in its parent process before it
        # forks the engine.
        try:
            ids = [
                int(i)
                for i in np.asarray(tokenizer.tokenize(probe["text"])).reshape(-1)
            ]
        except Exception as e:  # tokenizer libraries raise many types
            raise ArtifactError(
                f"The tokenizer failed on a recorded probe ({type(e).__name__}:"
                f" {str(e)[:200]}); its assets do not belong to this model."
            ) from None
        if ids != probe["ids"]:
            raise IntegrityError(
                "The tokenizer does not reproduce the token ids recorded at "
                f"export for {probe['text']!r}; its assets do not belong to "
                "this model."
            )
    return tokenizer


def _check_vocabulary_size(tokenizer, manifest):
    """The tokenizer's ids index the embedding: never more than its rows."""
    rows = manifest["backbone"]["config"].get("vocabulary_size")
    try:
        size = int(tokenizer.vocabulary_size())
    except Exception as e:  # tokenizer libraries raise many types
        raise ArtifactError(
            f"The tokenizer assets could not be loaded ({type(e).__name__}: "
            f"{str(e)[:200]})."
        ) from None
    if isinstance(rows, int) and size > rows:
        raise ArtifactError(
            f"The tokenizer's vocabulary has {size} entries but the "
            f"backbone's embedding has {rows} rows "
            "('backbone.config.vocabulary_size'); its ids would index past "
            "the embedding. The tokenizer assets do not belong to this "
            "model; re-export it."
        )


def preflight(path, manifest, preset=None):
    """The checks `KerasVllmEngine.from_export` runs before vLLM starts.

    Resolves every class against the allowlist, checks that a referenced
    preset is available, and loads the tokenizer (replaying its recorded
    probes). None of this starts a JAX runtime, so vLLM can still fork.

    Raises:
        ArtifactError: (or a subclass) as `load_causal_lm` would.
    """
    resolve_classes(manifest)
    if adapter.is_adapter(manifest):
        adapter.open_base(path, manifest)
    if manifest["preset"] is not None and manifest["weights"]["mode"] != "full":
        recorded = manifest["preset"]
        presets.check_available(
            preset or recorded["handle"], sorted(recorded["files"])
        )
    load_tokenizer(path, manifest)


def load_causal_lm(
    path, *, dtype=None, preset=None, base=None, verify=True, verbose="auto",
    public_key=None,
):
    """Rebuilds a KerasHub `CausalLM` from a keras-vllm artifact.

    Checksums are verified before anything is read. Works offline when the
    referenced preset is a local directory or already in keras-hub's cache
    (or when the artifact stores all weights).

    Args:
        path: the artifact directory.
        dtype: variable dtype (`"float32"`, `"bfloat16"`...); defaults to the
            exported dtype.
        preset: use this preset directory or handle instead of the recorded
            reference (same content required).
        base: for an adapter artifact, its base artifact's directory
            instead of the recorded path (it must be the recorded artifact,
            by manifest hash). The model is returned with LoRA enabled and
            the adapter's factors loaded, not merged.
        verify: check every file's checksum first (recommended).
        verbose: `"auto"` draws one progress line per phase on a terminal
            (not in CI); `True` also prints the phases elsewhere; `False`
            prints nothing.
        public_key: path of a PEM public key: the artifact must carry a
            signature by it (`model.sig`), checked before anything else is
            read (`SignatureError` otherwise). Defaults to
            `KERAS_VLLM_PUBLIC_KEY`; unset, no signature is needed.

    Returns:
        The `keras_hub.models.CausalLM`, compiled with the exported sampler.

    Example:

    ```python
    causal_lm = keras_vllm.load_causal_lm("exports/gemma2_tuned")
    causal_lm.generate("The quick brown fox", max_length=32)
    ```
    """
    path = os.fspath(path)
    with progress.verbosity(verbose):
        return _load_causal_lm(path, dtype, preset, verify, public_key, base)


def _load_causal_lm(path, dtype, preset, verify, public_key, base=None):
    manifest = open_verified(
        path, verify=verify, verbose="auto", public_key=public_key
    ).manifest
    resolved = resolve_classes(manifest)
    if adapter.is_adapter(manifest):
        # The base is the recorded one and fits, before anything is built.
        adapter.open_base(path, manifest, base, verify=verify)
    # The tokenizer first: it is cheap, and its probes catch swapped assets
    # before any weight is allocated.
    tokenizer = load_tokenizer(path, manifest)
    pp_cls, pp_config = _config(manifest, "preprocessor")
    preprocessor = _construct(
        pp_cls, {**pp_config, "tokenizer": tokenizer}, "preprocessor"
    )
    sampler_cls, sampler_config = _config(manifest, "sampler")
    sampler = _construct(sampler_cls, sampler_config, "sampler")
    backbone = build_backbone(
        path, manifest, dtype=dtype, preset=preset, base=base
    )
    lm_cls = resolved["causal_lm"]
    try:
        causal_lm = lm_cls(backbone=backbone, preprocessor=preprocessor)
    except Exception as e:  # keras-hub raises many types
        raise ArtifactError(
            f"The artifact's classes do not build a {lm_cls.__name__} "
            f"({type(e).__name__}: {str(e)[:300]}); re-export the model."
        ) from None
    causal_lm.compile(sampler=sampler)
    return causal_lm


def check_golden(causal_lm, path, manifest=None):
    """Replays the artifact's golden prompts through `causal_lm`.

    Returns:
        A list of `(prompt, expected_ids, actual_ids)` for mismatches (empty
        when the model reproduces every recorded output).
    """
    opened = fmt.open_artifact(path, verify=manifest is None)
    manifest = manifest or opened.manifest
    golden = opened.read_json(fmt.GOLDEN_FILE)
    stops = manifest["stop_token_ids"]
    records = golden["outputs"]
    actuals = reference.greedy_batch(
        causal_lm,
        [record["prompt_ids"] for record in records],
        golden["max_new_tokens"],
        stops,
        manifest.get("golden_reference", "generate"),
    )
    failures = []
    for record, actual in zip(records, actuals):
        if actual != record["output_ids"]:
            failures.append((record["prompt"], record["output_ids"], actual))
    return failures
