"""`export_assistant()`: a speculative-decoding assistant -> its artifact.

The format is `keras_vllm.format.assistant`; the assistant is served as
the drafter of its target (`speculative_config={"method": "mtp", "model":
<assistant artifact>, ...}`, `keras_vllm/serve/speculation.py`).
"""

import logging
import os

from keras_vllm import format as fmt
from keras_vllm.errors import ExportError
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.export import model_facts
from keras_vllm.export import sections
from keras_vllm.export import staging
from keras_vllm.format import assistant as assistant_format
from keras_vllm.format.assistant import BACKBONE_PREFIX
from keras_vllm.format.assistant import PROJECTIONS
from keras_vllm.format.assistant import TOKEN_ORDERING
from keras_vllm.hub import checkpoint
from keras_vllm.hub import weights as weight_io

logger = logging.getLogger("keras_vllm")

# The assistant's own arguments, besides its backbone.
ASSISTANT_ARGS = (
    "backbone_hidden_size",
    "num_centroids",
    "centroid_intermediate_top_k",
    "use_ordered_embeddings",
    "num_speculative_tokens",
)


def assistant_facts(assistant):
    """What an assistant needs of its target (`format.assistant.
    fit_problems`), read from the Keras model.

    Raises:
        UnsupportedModelError: it is no KerasHub MTP assistant.
    """
    backbone = getattr(assistant, "backbone", None)
    if backbone is None or not all(
        hasattr(assistant, name) for name in ASSISTANT_ARGS + PROJECTIONS[:2]
    ):
        raise UnsupportedModelError(
            f"{type(assistant).__name__} is no KerasHub multi-token-"
            "prediction assistant (one with `backbone_hidden_size`, "
            "`pre_projection` and `post_projection`, such as "
            "`keras_hub.models.Gemma4AssistantCausalLM`)."
        )
    layers = backbone.transformer_layers
    if not all(layer.attention.is_kv_shared_layer for layer in layers):
        raise UnsupportedModelError(
            "Every layer of an assistant reads its target's KV cache "
            "(`is_kv_shared_layer`); this one has layers with caches of "
            "their own, which vLLM's MTP drafting does not keep."
        )
    types = [
        "full_attention" if layer.attention.is_global_attention
        else "sliding_attention"
        for layer in layers
    ]
    kinds = {}
    for kind, layer in zip(types, layers):
        cache = [
            int(layer.attention.head_dim),
            int(layer.attention.effective_num_kv_heads),
        ]
        kinds.setdefault(kind, cache)
    return {
        "backbone_hidden_size": int(assistant.backbone_hidden_size),
        "vocab_size": int(backbone.vocabulary_size),
        "layer_types": types,
        "kind_caches": kinds,
    }


def assistant_weights(assistant):
    """`{name: numpy array}`: the backbone's variables and the
    assistant's projections, named as `format.assistant` says."""
    import numpy as np

    stored = {
        f"{BACKBONE_PREFIX}{i:05d}": value
        for i, value in enumerate(
            weight_io.backbone_weights(assistant.backbone).values()
        )
    }
    for name in PROJECTIONS:
        layer = getattr(assistant, name, None)
        if layer is not None:
            stored[f"{name}/kernel"] = np.asarray(layer.kernel.numpy())
    ordering = getattr(assistant, TOKEN_ORDERING, None)
    if ordering is not None:
        stored[TOKEN_ORDERING] = np.asarray(ordering.numpy())
    return stored


def export_assistant(assistant, path, target, *, overwrite=False):
    """Exports a KerasHub MTP assistant as the drafter of an artifact.

    Args:
        assistant: a `keras_hub.models.Gemma4AssistantCausalLM` (or another
            KerasHub assistant with the same interface).
        path: the assistant artifact's directory to create.
        target: the target's keras-vllm artifact directory (exported with
            `export_vllm()`). The assistant records its manifest's SHA-256;
            a fine-tune of that target with the same shape is also served
            with it (output unchanged, acceptance may drop).
        overwrite: replace an existing artifact at `path`.

    Returns:
        The absolute path of the assistant artifact.

    Raises:
        UnsupportedModelError: it is no assistant keras-vllm serves.
        ExportError: it does not fit the target, naming what differs.

    Example:

    ```python
    target_lm.export_vllm("exports/tuned")
    keras_vllm.export_assistant(assistant_lm, "exports/tuned_assistant",
                                target="exports/tuned")
    ```
    """
    facts = assistant_facts(assistant)
    target_path = os.path.abspath(os.fspath(target))
    opened = fmt.open_artifact(target_path)
    target_config = opened.read_json(fmt.CONFIG_FILE)
    problems = assistant_format.fit_problems(
        facts, assistant_format.target_facts(target_config)
    )
    if problems:
        raise ExportError(
            f"{type(assistant).__name__} cannot draft for '{target_path}': "
            + "; ".join(problems)
            + ". Export the assistant trained for this target."
        )
    backbone = assistant.backbone
    dtype = model_facts.dtype_name(backbone)
    stored = assistant_weights(assistant)
    causal_lm = sections.serialize(assistant, "causal_lm")
    causal_lm["config"] = {
        key: getattr(assistant, key) for key in ASSISTANT_ARGS
    }
    with staging.staged_directory(path, overwrite) as tmp:
        checkpoint.save_weights(os.path.join(tmp, fmt.WEIGHTS_DIR), stored)
        config = assistant_format.vllm_config(
            facts, backbone.get_config(), dtype,
            target_config.get("max_position_embeddings"),
        )
        fmt.write_json(os.path.join(tmp, fmt.CONFIG_FILE), config)
        manifest = {
            "format": assistant_format.ASSISTANT_FORMAT,
            "format_version": list(assistant_format.ASSISTANT_FORMAT_VERSION),
            "written_by": sections.versions(),
            "dtype": dtype,
            "backbone": sections.serialize(backbone, "backbone"),
            "causal_lm": causal_lm,
            "facts": facts,
            "target": {
                "manifest_sha256": fmt.manifest_hash(target_path),
                "facts": assistant_format.target_facts(target_config),
            },
            "weights": {
                "format": "orbax",
                "directory": fmt.WEIGHTS_DIR,
                "variables": {
                    p: {"shape": list(v.shape), "dtype": str(v.dtype)}
                    for p, v in sorted(stored.items())
                },
            },
            "files": fmt.file_table(tmp),
        }
        fmt.write_json(os.path.join(tmp, fmt.MANIFEST_FILE), manifest)
    logger.info("keras-vllm: exported assistant %s for %s", path, target_path)
    return os.path.abspath(os.fspath(path))
