"""Assistant artifact -> the Keras assistant (`export/assistant.py`)."""

import logging
import os

from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ServingError
from keras_vllm.format.assistant import BACKBONE_PREFIX
from keras_vllm.format.assistant import PROJECTIONS
from keras_vllm.format.assistant import TOKEN_ORDERING
from keras_vllm.format import assistant as assistant_format
from keras_vllm.hub import checkpoint
from keras_vllm.hub import classes
from keras_vllm.hub import weights as weight_io
from keras_vllm.load import rebuild
from keras_vllm.load import uninitialized

logger = logging.getLogger("keras_vllm")


def check_fits(manifest, target_config, target_path, assistant_path):
    """Refuses an assistant that cannot draft for the target (naming what
    differs); logs when the target is not the one it was exported with.

    Raises:
        ServingError: the assistant does not fit the target.
    """
    problems = assistant_format.fit_problems(
        manifest["facts"], assistant_format.target_facts(target_config)
    )
    if problems:
        raise ServingError(
            f"The assistant '{assistant_path}' cannot draft for "
            f"'{target_path}': " + "; ".join(problems) + ". Serve the "
            "assistant exported for this target (`export_assistant(..., "
            "target=...)`), or n-gram speculation."
        )
    recorded = manifest["target"].get("manifest_sha256")
    if recorded != fmt.manifest_hash(target_path):
        logger.info(
            "keras-vllm: the assistant '%s' was exported for another target "
            "artifact (manifest %s); it has the shape of '%s' and drafts "
            "for it (outputs unchanged; acceptance may be lower).",
            assistant_path, str(recorded)[:12], target_path,
        )


def load_assistant(path, dtype=None, verify=True):
    """Rebuilds the Keras assistant of an assistant artifact.

    Args:
        path: the assistant artifact's directory.
        dtype: the dtype to build in; defaults to the exported one.
        verify: hash every file against the manifest first.

    Returns:
        The assistant (`keras_hub.models.Gemma4AssistantCausalLM`), to pass
        as `generate(..., assistant_model=...)` or to serve.

    Example:

    ```python
    assistant = keras_vllm.load_assistant("exports/tuned_assistant")
    target_lm.generate("The", assistant_model=assistant)
    ```
    """
    path = os.path.abspath(os.fspath(path))
    manifest, _ = assistant_format.read_assistant(path, verify=verify)
    dtype = dtype or manifest["dtype"]
    backbone_cls, config = rebuild.role_config(manifest, "backbone")
    section = manifest["causal_lm"]
    cls = classes.resolve(section["registered_name"], "causal_lm")
    # Every variable is stored: none needs its initializer's value (the
    # random initializers' programs were most of a drafter's load). The
    # assistant's own layers (projections, centroids: small) build as
    # usual: its constructor creates variables where Keras' stateless
    # scope refuses them.
    with uninitialized.values_deferred():
        backbone = rebuild.construct(
            backbone_cls, dict(config, dtype=dtype), "backbone"
        )
    try:
        assistant = cls(backbone=backbone, **section["config"])
    except Exception as e:  # Keras and keras-hub raise many types
        uninitialized.forget(backbone)
        raise ArtifactError(
            f"The assistant artifact '{path}' does not build a "
            f"{cls.__name__} ({type(e).__name__}: {str(e)[:300]}). It was "
            "altered or written by another keras-hub; re-export it."
        ) from None
    uninitialized.fill(
        assistant, lambda: stored_values(assistant, path, manifest)
    )
    return assistant


def assistant_variables(assistant):
    """`{stored name: variable}` in the order `export_assistant` stores."""
    variables = {
        f"{BACKBONE_PREFIX}{i:05d}": variable
        for i, variable in enumerate(
            weight_io.ordered_variables(assistant.backbone)
        )
    }
    for name in PROJECTIONS:
        layer = getattr(assistant, name, None)
        if layer is not None:
            variables[f"{name}/kernel"] = layer.kernel
    ordering = getattr(assistant, TOKEN_ORDERING, None)
    if ordering is not None:
        variables[TOKEN_ORDERING] = ordering
    return variables


def stored_values(assistant, path, manifest):
    """`[(variable, stored value)]` of every variable of the assistant,
    each checked against its variable's shape first (and cast to its
    dtype)."""
    variables = assistant_variables(assistant)
    stored = manifest["weights"]["variables"]
    if set(stored) != set(variables):
        missing = sorted(set(variables) - set(stored))
        raise ArtifactError(
            f"The assistant artifact '{path}' stores "
            f"{len(stored)} variables, its model has {len(variables)} "
            f"(first unmatched: {(missing or sorted(stored))[0]!r}). It was "
            "altered; re-export it."
        )
    specs = {}
    for name, variable in variables.items():
        shape = tuple(stored[name]["shape"])
        if shape != tuple(variable.shape):
            raise ArtifactError(
                f"The assistant artifact '{path}' stores '{name}' with shape "
                f"{shape}, its model's variable has {tuple(variable.shape)}. "
                "It was altered; re-export it."
            )
        specs[name] = (shape, checkpoint.dtype_of(stored[name]["dtype"]))
    restored = checkpoint.restore_weights(
        os.path.join(path, fmt.WEIGHTS_DIR), specs, as_numpy=False
    )
    values = []
    for name, variable in variables.items():
        value = restored[name]
        if str(value.dtype) != variable.dtype:
            value = value.astype(variable.dtype)
        values.append((variable, value))
    return values
