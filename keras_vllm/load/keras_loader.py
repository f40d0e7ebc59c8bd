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
from keras_vllm.load.opening import open_verified


def _config(manifest, role):
    section = manifest[role]
    config = dict(section["config"])
    fmt.configs.check_config_values(config, f"{role}.config")
    return classes.resolve(section["registered_name"], role), config


def _construct(cls, config, role):
    """`cls.from_config(config)`, with any failure as an `ArtifactError`."""
    try:
        return cls.from_config(config)
    except Exception as e:  # Keras and keras-hub raise many types
        raise ArtifactError(
            f"The artifact's {role} config does not build a {cls.__name__} "
            f"({type(e).__name__}: {str(e)[:300]}). The manifest was altered "
            "or written by another keras-hub; re-export the model."
        ) from None


# Keyword arguments every Keras layer accepts besides its own.
_LAYER_KWARGS = ("name", "dtype", "trainable")


def check_backbone_config(cls, config):
    """Checks a backbone config's keys against its class's constructor
    (reflection only: nothing is built, JAX is not started)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    allowed = {
        name
        for name, p in params.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    } | set(_LAYER_KWARGS)
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ArtifactError(
            f"The artifact's backbone config has '{unknown[0][:100]}', which "
            f"{cls.__name__} does not take. The manifest was altered or "
            "written by another keras-hub; re-export the model."
        )
    required = sorted(
        name
        for name, p in params.items()
        if name != "self"
        and p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in config
    )
    if required:
        raise ArtifactError(
            f"The artifact's backbone config lacks '{required[0]}', which "
            f"{cls.__name__} needs; re-export the model."
        )


def resolve_classes(manifest):
    """Resolves every class of the artifact against the allowlist and checks
    that they belong together (the task's backbone class, the
    preprocessor's tokenizer class).

    Returns:
        `{role: class}`.
    """
    resolved = {
        role: classes.resolve(manifest[role]["registered_name"], role)
        for role in ("backbone", "causal_lm", "tokenizer", "preprocessor", "sampler")
    }
    expected = getattr(resolved["causal_lm"], "backbone_cls", None)
    if expected is not None and not issubclass(resolved["backbone"], expected):
        raise ArtifactError(
            f"The artifact pairs a {resolved['causal_lm'].__name__} with a "
            f"{resolved['backbone'].__name__}; the task expects a "
            f"{expected.__name__}. The manifest was altered; re-export it."
        )
    expected = getattr(resolved["preprocessor"], "tokenizer_cls", None)
    if expected is not None and not issubclass(resolved["tokenizer"], expected):
        raise ArtifactError(
            f"The artifact pairs a {resolved['preprocessor'].__name__} with a "
            f"{resolved['tokenizer'].__name__}; the preprocessor expects a "
            f"{expected.__name__}. The manifest was altered; re-export it."
        )
    check_backbone_config(resolved["backbone"], manifest["backbone"]["config"])
    return resolved


def _same_config(a, b):
    strip = lambda c: {k: v for k, v in c.items() if k not in ("dtype", "name")}
    return strip(a) == strip(b)


def build_backbone(path, manifest, dtype=None, preset=None):
    """Rebuilds the backbone with the artifact's weights.

    Args:
        path: artifact directory (already verified).
        manifest: its validated manifest.
        dtype: variable dtype to build in; defaults to the exported one.
        preset: a local directory or handle to use instead of the recorded
            preset reference (its files must hash to the recorded values).

    Returns:
        A `keras_hub.models.Backbone`.
    """
    import keras_hub

    cls, config = _config(manifest, "backbone")
    dtype = dtype or manifest["dtype"]
    weights = manifest["weights"]
    mode = weights["mode"]
    if mode == "full":
        with progress.phase(f"building {cls.__name__}"):
            backbone = _construct(cls, {**config, "dtype": dtype}, "backbone")
    else:
        handle = preset or manifest["preset"]["handle"]
        with progress.phase(f"loading preset '{handle}'"):
            presets.check_preset(handle, manifest["preset"]["files"])
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
    ordered = weight_io.ordered_variables(backbone)
    variables = {}
    specs = {}
    for var_path, spec in weights["variables"].items():
        # Matched by position (paths of auto-named layers differ between
        # processes); the path must agree up to auto-numbering.
        target = weight_io.match_variable(ordered, var_path, spec.get("index"))
        variables[var_path] = target
        if tuple(target.shape) != tuple(spec["shape"]):
            raise ArtifactError(
                f"Variable '{var_path}' has shape {tuple(spec['shape'])} in "
                f"the artifact but {tuple(target.shape)} in the backbone."
            )
        specs[var_path] = (tuple(spec["shape"]), spec["dtype"])
    if mode == "full" and len(specs) != len(ordered):
        stored = {id(v) for v in variables.values()}
        missing = [v.path for v in ordered if id(v) not in stored]
        raise ArtifactError(
            f"The artifact is a full export but lacks variable "
            f"'{(missing or ['?'])[0]}'."
        )
    if specs:
        directory = fmt.safe_join(path, fmt.WEIGHTS_DIR)
        with progress.phase(
            f"restoring {mode} weights", total=weights["bytes"], unit="bytes"
        ) as phase:
            restored = weight_io.restore_weights(directory, specs)
            for var_path, value in restored.items():
                variable = variables[var_path]
                variable.assign(value.astype(variable.dtype))
                phase.advance(value.nbytes)
    return backbone


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
    tokenizer = _construct(cls, config, "tokenizer")
    try:
        tokenizer.load_assets(assets)
    except Exception as e:  # tokenizer libraries raise many types
        raise ArtifactError(
            f"The tokenizer assets could not be loaded ({type(e).__name__}: "
            f"{str(e)[:200]})."
        ) from None
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


def preflight(path, manifest, preset=None):
    """The checks `KerasVllmEngine.from_export` runs before vLLM starts.

    Resolves every class against the allowlist, checks that a referenced
    preset is available, and loads the tokenizer (replaying its recorded
    probes). None of this starts a JAX runtime, so vLLM can still fork.

    Raises:
        ArtifactError: (or a subclass) as `load_causal_lm` would.
    """
    resolve_classes(manifest)
    if manifest["weights"]["mode"] != "full":
        recorded = manifest["preset"]
        presets.check_available(
            preset or recorded["handle"], sorted(recorded["files"])
        )
    load_tokenizer(path, manifest)


def load_causal_lm(
    path, *, dtype=None, preset=None, verify=True, verbose="auto",
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
        return _load_causal_lm(path, dtype, preset, verify, public_key)


def _load_causal_lm(path, dtype, preset, verify, public_key):
    manifest = open_verified(
        path, verify=verify, verbose="auto", public_key=public_key
    ).manifest
    resolved = resolve_classes(manifest)
    # The tokenizer first: it is cheap, and its probes catch swapped assets
    # before any weight is allocated.
    tokenizer = load_tokenizer(path, manifest)
    pp_cls, pp_config = _config(manifest, "preprocessor")
    preprocessor = _construct(
        pp_cls, {**pp_config, "tokenizer": tokenizer}, "preprocessor"
    )
    sampler_cls, sampler_config = _config(manifest, "sampler")
    sampler = _construct(sampler_cls, sampler_config, "sampler")
    backbone = build_backbone(path, manifest, dtype=dtype, preset=preset)
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
    greedy = reference.greedy_by(manifest.get("golden_reference", "generate"))
    failures = []
    for record in golden["outputs"]:
        actual = greedy(
            causal_lm,
            record["prompt_ids"],
            golden["max_new_tokens"],
            stops,
        )
        if actual != record["output_ids"]:
            failures.append((record["prompt"], record["output_ids"], actual))
    return failures
