"""Rebuilding a backbone from an artifact's config and stored weights.

The building blocks every artifact kind shares: its classes constructed in
Keras' safe mode, the preset or config it starts from, and the stored
variables matched by position and restored. `keras_loader` builds models
and tokenizers from them, `adapter` an adapter's base and factors.
"""

from keras_vllm import format as fmt
from keras_vllm.hub import classes
from keras_vllm.hub import presets
from keras_vllm import progress
from keras_vllm.hub import imports
from keras_vllm.hub import checkpoint
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.load import quantized
from keras_vllm.load import uninitialized


def role_config(manifest, role):
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


def construct(cls, config, role):
    """`cls.from_config(config)` in Keras' safe mode, with any failure as
    an `ArtifactError`."""
    try:
        with _safe_mode():
            return cls.from_config(config)
    except Exception as e:  # Keras and keras-hub raise many types
        if "tensorflow" in str(e).lower() and not _tensorflow_installed():
            # A class that asserts TensorFlow in its constructor (a few
            # keras-hub 0.32 preprocessors) on a host without it (the TPU
            # machines this project serves on have none).
            raise ArtifactError(
                f"{cls.__name__} needs TensorFlow (its keras-hub constructor "
                "asserts it), which is not installed here. Install "
                "tensorflow to rebuild the Keras model; serving the artifact "
                "(KerasVllmEngine.from_export, vllm serve) needs none."
            ) from None
        if "tensorflow" in str(e).lower() and (
            imports.imported_without_tensorflow()
        ):
            # The same class in a process that imported keras-hub for
            # serving, without TensorFlow.
            raise ArtifactError(
                f"{cls.__name__} needs TensorFlow, and this process imported "
                "keras-hub without it to serve. Set "
                "KERAS_VLLM_SERVING_TENSORFLOW=1, or import keras_hub before "
                "starting an engine."
            ) from None
        raise ArtifactError(
            f"The artifact's {role} config does not build a {cls.__name__} "
            f"({type(e).__name__}: {str(e)[:300]}). The manifest was altered "
            "or written by another keras-hub; re-export the model."
        ) from None


def _tensorflow_installed():
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


def _same_config(a, b):
    strip = lambda c: {k: v for k, v in c.items() if k not in ("dtype", "name")}
    return strip(a) == strip(b)


def build_model_backbone(artifact, dtype=None, preset=None):
    """Rebuilds the backbone of a full, delta or preset artifact with its
    weights (`keras_loader.build_backbone` also builds adapters).

    Args:
        artifact: the opened, verified `keras_vllm.format.Artifact`.
        dtype: variable dtype to build in; defaults to the exported one.
        preset: a local directory or handle to use instead of the recorded
            preset reference (its files must hash to the recorded values).

    Returns:
        A `keras_hub.models.Backbone`.
    """
    import keras_hub

    manifest = artifact.manifest
    cls, config = role_config(manifest, "backbone")
    dtype = dtype or manifest["dtype"]
    weights = manifest["weights"]
    mode = weights["mode"]
    policies = quantized.policy_map(manifest, dtype)
    preset_backbone = None
    if mode == "full":
        # Every variable is stored: none needs its initializer's value
        # (a quantized build reads its float values while quantizing).
        with progress.phase(f"building {cls.__name__}"), \
                uninitialized.values_deferred(policies is None):
            backbone = construct(
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
                backbone = construct(
                    cls, {**config, "dtype": policies}, "backbone"
                )
    if policies is not None:
        quantized.check_rebuilt(backbone, manifest)
        quantized.match_inputs_quantizers(backbone)
    values = uninitialized.fill(
        backbone, lambda: stored_values(backbone, artifact, dtype)
    )
    if preset_backbone is not None:
        quantized.fill_from_preset(
            backbone, preset_backbone, {id(v) for v, _ in values}
        )
    if policies is not None:
        quantized.mark_calibrated(backbone)
    return backbone


def stored_values(backbone, artifact, dtype=None):
    """The artifact's stored weights, matched to `backbone`'s variables.

    Args:
        backbone: a backbone of the artifact's architecture (built from
            its config, or one already serving).
        artifact: the opened, verified `keras_vllm.format.Artifact`.
        dtype: the dtype the values are cast to; defaults to the exported
            one.

    Returns:
        `[(variable, value)]` for every stored variable (all of them in a
        full export), values in the variables' dtypes.

    Raises:
        ArtifactError: when an entry does not match its variable.
    """
    manifest = artifact.manifest
    dtype = dtype or manifest["dtype"]
    weights = manifest["weights"]
    mode = weights["mode"]
    variables, specs = matched_specs(backbone, manifest, dtype)
    if specs:
        directory = artifact.file(fmt.WEIGHTS_DIR)
        with progress.phase(
            f"restoring {mode} weights", total=weights["bytes"], unit="bytes"
        ) as phase:
            restored = checkpoint.restore_weights(
                directory, specs, as_numpy=False
            )
            values = cast_values(variables, restored)
            quantized.check_values(backbone, values)
            phase.advance(sum(v.nbytes for _, v in values))
            return values
    return []


def cast_values(variables, restored):
    """`[(variable, value)]` for the restored `{path: array}` of matched
    `variables`, cast only when the caller asked for another dtype."""
    import jax
    import numpy as np

    values = []
    for var_path, variable in variables.items():
        value = restored[var_path]
        if str(value.dtype) != variable.dtype:
            # On the host: orbax restored the arrays onto the CPU device,
            # and an engine builds its model inside tpu-inference's device
            # mesh, where a JAX op on a CPU array is refused on a TPU
            # ("Received incompatible devices": a float32 artifact served
            # in bfloat16). numpy rounds as JAX does (to nearest even); the
            # result goes back where the restored array was.
            cast = np.asarray(value).astype(variable.dtype)
            sharding = getattr(value, "sharding", None)
            value = cast if sharding is None else jax.device_put(cast, sharding)
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


