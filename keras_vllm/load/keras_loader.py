"""Artifact -> Keras: rebuild the `CausalLM` (training side, no vLLM)."""

import os

import numpy as np

from keras_vllm import format as fmt
from keras_vllm import logs
from keras_vllm.hub import pairings
from keras_vllm.hub import presets
from keras_vllm import progress
from keras_vllm.hub import reference
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.load.class_checks import check_config_keys
from keras_vllm.load.class_checks import resolve_classes
from keras_vllm.load import adapter
from keras_vllm.load.golden_images import check_golden_images
from keras_vllm.load import rebuild
from keras_vllm.load.opening import open_verified
from keras_vllm.load.rebuild import role_config


def build_backbone(artifact, dtype=None, preset=None, base=None,
                   merge_lora=False):
    """Rebuilds the backbone with the artifact's weights.

    Args:
        artifact: the opened, verified `keras_vllm.format.Artifact`.
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
    if adapter.is_adapter(artifact.manifest):
        return adapter.build_adapter_backbone(
            artifact, dtype=dtype, preset=preset, base=base, merge=merge_lora,
        )
    return rebuild.build_model_backbone(artifact, dtype, preset)


def _opened(artifact):
    """An opened artifact, or the verified artifact at a path."""
    if isinstance(artifact, fmt.Artifact):
        return artifact
    return open_verified(os.fspath(artifact))


def load_tokenizer(artifact):
    """Rebuilds the artifact's native KerasHub tokenizer (offline).

    Args:
        artifact: an opened `keras_vllm.format.Artifact`, or the path of
            one (opened and verified here).

    Returns:
        A `keras_hub.tokenizers.Tokenizer` with its assets loaded.

    Example:

    ```python
    tokenizer = keras_vllm.load.keras_loader.load_tokenizer("exports/tuned")
    tokenizer("The quick brown fox")
    ```
    """
    artifact = _opened(artifact)
    return tokenizer_from_files(
        artifact.manifest, artifact.file(fmt.TOKENIZER_ASSETS_DIR)
    )


def tokenizer_from_files(manifest, assets):
    """The tokenizer a manifest describes, from its asset directory, with
    every check `load_tokenizer` runs (the caller verified the files).

    Args:
        manifest: the artifact's validated manifest (its `tokenizer`,
            `preprocessor` and `backbone` sections are read).
        assets: the directory of the tokenizer's assets.

    Returns:
        A `keras_hub.tokenizers.Tokenizer` with its assets loaded.
    """
    section = manifest["tokenizer"]
    cls, config = role_config(manifest, "tokenizer")
    names = section.get("assets")
    if not isinstance(names, list) or sorted(os.listdir(assets)) != sorted(
        names
    ):
        raise ArtifactError(
            "The tokenizer assets on disk differ from those the manifest lists."
        )
    fmt.references.check_asset_fields(config, "tokenizer.config")
    # tensorflow-text's SentencePiece prints an INFO line from C++ as its
    # model loads (at the first probe).
    with logs.without_sentencepiece_info():
        check_config_keys(cls, config, "tokenizer")
        _check_pairing(manifest, cls, config, assets, section)
        config = fmt.tokenizer_args.constructor_config(cls.__name__, config)
        tokenizer = _load_and_probe(cls, config, assets, section, manifest)
    return tokenizer


def _check_pairing(manifest, tokenizer_cls, config, assets, section):
    """The preprocessor takes the tokenizer (`keras_vllm.hub.pairings`, the
    rule export applies before it writes), compared on the recorded
    probes' texts."""
    preprocessor_cls, _ = role_config(manifest, "preprocessor")
    problem = pairings.tokenizer_problem(
        preprocessor_cls, tokenizer_cls, config, assets,
        [probe["text"] for probe in section.get("golden", [])],
    )
    if problem is not None:
        raise ArtifactError(
            f"The artifact pairs a {preprocessor_cls.__name__} with a "
            f"{tokenizer_cls.__name__}: {problem}. Export refuses such a "
            "model, so the manifest was altered; re-export the model."
        )


def _load_and_probe(cls, config, assets, section, manifest):
    """Builds the tokenizer, loads its assets and replays its probes."""
    tokenizer = rebuild.construct(cls, config, "tokenizer")
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
    rows = fmt.configs.size(manifest["backbone"]["config"], "vocabulary_size")
    try:
        size = int(tokenizer.vocabulary_size())
    except Exception as e:  # tokenizer libraries raise many types
        raise ArtifactError(
            f"The tokenizer assets could not be loaded ({type(e).__name__}: "
            f"{str(e)[:200]})."
        ) from None
    problem = pairings.vocabulary_problem(size, rows)
    if problem is not None:
        raise ArtifactError(
            f"In this artifact {problem}. Export refuses such a model, so "
            "the tokenizer assets or 'backbone.config' were altered; "
            "re-export the model."
        )


def preflight(artifact, preset=None):
    """The checks `KerasVllmEngine.from_export` runs before vLLM starts.

    Resolves every class against the allowlist, checks that a referenced
    preset is available, and loads the tokenizer (replaying its recorded
    probes). None of this starts a JAX runtime, so vLLM can still fork.

    Raises:
        ArtifactError: (or a subclass) as `load_causal_lm` would.
    """
    resolve_classes(artifact.manifest)
    check_sources(artifact, preset)
    load_tokenizer(artifact)


def check_sources(artifact, preset=None):
    """Checks that what the artifact loads its base weights from is here:
    an adapter's base artifact, a delta's preset files (resolved, not
    hashed: the engine process hashes them once, when it loads them).

    Raises:
        ArtifactError: (or a subclass: `PresetUnavailableError`, naming how
            to make the preset available offline).
    """
    manifest = artifact.manifest
    if adapter.is_adapter(manifest):
        adapter.open_base(artifact)
    if manifest["preset"] is not None and manifest["weights"]["mode"] != "full":
        recorded = manifest["preset"]
        presets.check_available(
            preset or recorded["handle"], sorted(recorded["files"])
        )


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
    artifact = open_verified(
        path, verify=verify, verbose="auto", public_key=public_key
    )
    manifest = artifact.manifest
    resolved = resolve_classes(manifest)
    if adapter.is_adapter(manifest):
        # The base is the recorded one and fits, before anything is built.
        adapter.open_base(artifact, base, verify=verify)
    # The tokenizer first: it is cheap, and its probes catch swapped assets
    # before any weight is allocated.
    tokenizer = load_tokenizer(artifact)
    preprocessor = build_preprocessor(manifest, tokenizer)
    sampler_cls, sampler_config = role_config(manifest, "sampler")
    sampler = rebuild.construct(sampler_cls, sampler_config, "sampler")
    backbone = build_backbone(artifact, dtype=dtype, preset=preset, base=base)
    _onto_default_device(backbone)
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


def _onto_default_device(backbone):
    """Moves the backbone's variables to the device JAX computes on.

    Orbax restores an artifact's weights onto the host's CPU device (an
    engine then lays them out on its own mesh), and a Keras variable keeps
    the device of the value it was given: on a TPU host the returned
    model's `generate()` ran on the host's CPU (seen: 46 tok/s where the
    chip gives 1,331). Under a Keras distribution the variables are laid
    out by it already, and stay.
    """
    import jax
    import keras

    if keras.distribution.distribution() is not None:
        return
    device = jax.config.jax_default_device
    if isinstance(device, str):
        device = jax.devices(device)[0]
    device = device or jax.devices()[0]
    for variable in backbone.variables:
        value = variable.value
        if getattr(value, "devices", lambda: {device})() != {device}:
            variable.assign(jax.device_put(value, device))


def build_preprocessor(manifest, tokenizer):
    """The artifact's preprocessor around its loaded tokenizer."""
    pp_cls, pp_config = role_config(manifest, "preprocessor")
    return rebuild.construct(
        pp_cls, {**pp_config, "tokenizer": tokenizer}, "preprocessor"
    )


def check_golden(causal_lm, artifact):
    """Replays the artifact's golden prompts through `causal_lm`.

    Args:
        causal_lm: the model to check (usually `load_causal_lm(path)`).
        artifact: an opened `keras_vllm.format.Artifact`, or the path of
            one (opened and verified here).

    Returns:
        A list of `(prompt, expected_ids, actual_ids)` for mismatches (empty
        when the model reproduces every recorded output).
    """
    artifact = _opened(artifact)
    manifest = artifact.manifest
    golden = artifact.read_json(fmt.GOLDEN_FILE)
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
    # Image prompts (format 1.11; none in text-only or older artifacts).
    return failures + check_golden_images(causal_lm, artifact)
