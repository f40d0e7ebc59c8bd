"""Artifact -> Keras: rebuild the `CausalLM` (training side, no vLLM)."""

import logging
import os

import numpy as np

from keras_vllm import artifact
from keras_vllm import classes
from keras_vllm import presets
from keras_vllm import reference
from keras_vllm import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError

logger = logging.getLogger("keras_vllm")

# Any integer in a backbone/tokenizer/preprocessor config above this is
# refused before a layer is built (hostile "huge dimension" manifests).
MAX_CONFIG_INT = 1 << 22


def _check_config_values(value, where):
    if isinstance(value, dict):
        for key, item in value.items():
            _check_config_values(item, f"{where}.{key}")
    elif isinstance(value, list):
        if len(value) > 10_000:
            raise ArtifactError(f"Invalid manifest: '{where}' is too long.")
        for i, item in enumerate(value):
            _check_config_values(item, f"{where}[{i}]")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -1 <= value <= MAX_CONFIG_INT:
            raise ArtifactError(
                f"Invalid manifest: '{where}' is {value}, outside "
                f"[-1, {MAX_CONFIG_INT}]."
            )
    elif isinstance(value, float):
        if not np.isfinite(value) or abs(value) > 1e12:
            raise ArtifactError(f"Invalid manifest: '{where}' is {value}.")
    elif isinstance(value, str):
        if len(value) > 100_000:
            raise ArtifactError(f"Invalid manifest: '{where}' is too long.")
    else:
        raise ArtifactError(f"Invalid manifest: '{where}' has a bad type.")


def _config(manifest, role):
    section = manifest[role]
    config = dict(section["config"])
    _check_config_values(config, f"{role}.config")
    return classes.resolve(section["registered_name"], role), config


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
        backbone = cls.from_config({**config, "dtype": dtype})
    else:
        handle = preset or manifest["preset"]["handle"]
        presets.check_preset(handle, manifest["preset"]["files"])
        logger.info("keras-vllm: loading base weights from %s", handle)
        backbone = keras_hub.models.Backbone.from_preset(handle, dtype=dtype)
        if type(backbone) is not cls or not _same_config(
            backbone.get_config(), config
        ):
            raise IntegrityError(
                f"The preset '{handle}' holds a different backbone than the "
                "one this artifact was exported from."
            )
    variables = {v.path: v for v in backbone.weights}
    specs = {}
    for var_path, spec in weights["variables"].items():
        target = variables.get(var_path)
        if target is None:
            raise ArtifactError(
                f"The artifact stores variable '{var_path}', which the "
                f"rebuilt {cls.__name__} does not have."
            )
        if tuple(target.shape) != tuple(spec["shape"]):
            raise ArtifactError(
                f"Variable '{var_path}' has shape {tuple(spec['shape'])} in "
                f"the artifact but {tuple(target.shape)} in the backbone."
            )
        specs[var_path] = (tuple(spec["shape"]), spec["dtype"])
    if mode == "full" and set(specs) != set(variables):
        missing = sorted(set(variables) - set(specs))
        raise ArtifactError(
            f"The artifact is a full export but lacks variable "
            f"'{missing[0]}'."
        )
    if specs:
        directory = artifact.safe_join(path, artifact.WEIGHTS_DIR)
        restored = weight_io.restore_weights(directory, specs)
        for var_path, value in restored.items():
            variable = variables[var_path]
            variable.assign(value.astype(variable.dtype))
    return backbone


def load_tokenizer(path, manifest=None):
    """Rebuilds the artifact's native KerasHub tokenizer (offline).

    Returns:
        A `keras_hub.tokenizers.Tokenizer` with its assets loaded.
    """
    manifest = manifest or artifact.open_artifact(path)
    section = manifest["tokenizer"]
    cls, config = _config(manifest, "tokenizer")
    assets = artifact.safe_join(path, artifact.TOKENIZER_ASSETS_DIR)
    names = section.get("assets")
    if not isinstance(names, list) or sorted(os.listdir(assets)) != sorted(
        names
    ):
        raise ArtifactError(
            "The tokenizer assets on disk differ from those the manifest lists."
        )
    tokenizer = cls.from_config(config)
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
        ids = [int(i) for i in np.asarray(tokenizer.tokenize(probe["text"]))]
        if ids != probe["ids"]:
            raise IntegrityError(
                "The tokenizer does not reproduce the token ids recorded at "
                f"export for {probe['text']!r}; its assets do not belong to "
                "this model."
            )
    return tokenizer


def load_causal_lm(path, *, dtype=None, preset=None, verify=True):
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

    Returns:
        The `keras_hub.models.CausalLM`, compiled with the exported sampler.

    Example:

    ```python
    causal_lm = keras_vllm.load_causal_lm("exports/gemma2_tuned")
    causal_lm.generate("The quick brown fox", max_length=32)
    ```
    """
    path = os.fspath(path)
    manifest = artifact.open_artifact(path, verify=verify)
    backbone = build_backbone(path, manifest, dtype=dtype, preset=preset)
    tokenizer = load_tokenizer(path, manifest)
    pp_cls, pp_config = _config(manifest, "preprocessor")
    preprocessor = pp_cls.from_config({**pp_config, "tokenizer": tokenizer})
    lm_cls = classes.resolve(manifest["causal_lm"]["registered_name"], "causal_lm")
    causal_lm = lm_cls(backbone=backbone, preprocessor=preprocessor)
    sampler_cls, sampler_config = _config(manifest, "sampler")
    causal_lm.compile(sampler=sampler_cls.from_config(sampler_config))
    return causal_lm


def check_golden(causal_lm, path, manifest=None):
    """Replays the artifact's golden prompts through `causal_lm`.

    Returns:
        A list of `(prompt, expected_ids, actual_ids)` for mismatches (empty
        when the model reproduces every recorded output).
    """
    manifest = manifest or artifact.open_artifact(path)
    golden = artifact.read_json(artifact.safe_join(path, artifact.GOLDEN_FILE))
    stops = manifest["stop_token_ids"]
    failures = []
    for record in golden["outputs"]:
        actual = reference.greedy_continuation(
            causal_lm,
            record["prompt_ids"],
            golden["max_new_tokens"],
            stops,
        )
        if actual != record["output_ids"]:
            failures.append((record["prompt"], record["output_ids"], actual))
    return failures
