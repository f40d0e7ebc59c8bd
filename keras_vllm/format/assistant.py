"""The assistant artifact: a speculative drafter bound to its target.

A multi-token-prediction assistant (KerasHub's `Gemma4AssistantCausalLM`)
drafts from its target's state: the target's embedding of the last token
and its last hidden state go in, and every assistant layer attends over the
KV cache of the target's last layer of the same kind. It is no model on its
own, so it is exported as its own small artifact that names the target
artifact it was exported with (the SHA-256 of the target's manifest) and
the target facts it depends on. Files:

- `manifest.json`: `format` (`keras_vllm_assistant`), `format_version`, the
  assistant's backbone and causal LM sections (class and config, as a
  model artifact's), `target` (`manifest_sha256`, `facts`), `weights`
  (every variable's shape and dtype) and `files` (SHA-256 and size of every
  other file);
- `config.json`: the neutral vLLM config (`model_type` keras-vllm's own,
  architecture `KerasVllmAssistantForCausalLM`) with the fields vLLM's
  speculative decoding reads (`backbone_hidden_size`, `layer_types`, ...);
- `weights/`: an orbax checkpoint of every variable.

A target that is not the recorded one (a fine-tune of it) is served when
the facts match: drafts only change how many tokens a step yields, never
which (greedy verification by the target), so only acceptance can drop.

Plain Python and JSON only (no JAX, Keras or vLLM).
"""

import os

from keras_vllm.errors import ArtifactError
from keras_vllm.format.checks import is_int
from keras_vllm.format.checksums import verify_files
from keras_vllm.format.files import read_json
from keras_vllm.format.files import safe_join
from keras_vllm.format.names import ASSISTANT_ARCHITECTURE
from keras_vllm.format.names import ASSISTANT_FORMAT_NAME
from keras_vllm.format.names import CONFIG_FILE
from keras_vllm.format.names import MANIFEST_FILE
from keras_vllm.format.names import MAX_DIM
from keras_vllm.format.names import MAX_MANIFEST_BYTES
from keras_vllm.format.names import MODEL_TYPE

ASSISTANT_FORMAT = ASSISTANT_FORMAT_NAME
ASSISTANT_FORMAT_VERSION = (1, 0)
# An assistant is a few layers; more in a manifest means it was altered.
MAX_LAYERS = 256

# How `weights/` names the stored variables: the backbone's by their
# position in `hub.weights.ordered_variables` (`backbone/00012`: Keras'
# paths of auto-named layers differ between processes), each projection
# layer's kernel as `<layer>/kernel`, and the vocabulary ordering of a
# centroid head.
BACKBONE_PREFIX = "backbone/"
PROJECTIONS = ("pre_projection", "post_projection", "centroids")
TOKEN_ORDERING = "token_ordering"

# The target facts an assistant depends on, as the target's `config.json`
# spells them: its width (the projections' input and output), vocabulary
# (its embedding feeds the assistant; the assistant's head scores it) and,
# per kind of layer, the cache the assistant's layers of that kind read.
TARGET_FACTS = (
    "hidden_size",
    "vocab_size",
    "layer_types",
    "num_kv_shared_layers",
    "head_dim",
    "num_key_value_heads",
    "global_head_dim",
    "num_global_key_value_heads",
)


def is_assistant(directory):
    """Whether `directory` holds an assistant artifact (by its manifest's
    `format`; False for a model artifact or a directory without one)."""
    try:
        manifest = read_json(
            safe_join(directory, MANIFEST_FILE), MAX_MANIFEST_BYTES
        )
    except (OSError, ArtifactError):
        return False
    return isinstance(manifest, dict) and (
        manifest.get("format") == ASSISTANT_FORMAT
    )


def target_facts(target_config):
    """The facts of a target's `config.json` an assistant depends on."""
    return {key: target_config.get(key) for key in TARGET_FACTS}


def kind_cache(facts, kind):
    """`(head_dim, num_kv_heads)` of the cache a layer of `kind` reads in a
    target with these facts."""
    if kind == "full_attention" and facts.get("global_head_dim"):
        return (
            facts["global_head_dim"],
            facts.get("num_global_key_value_heads")
            or facts["num_key_value_heads"],
        )
    return facts["head_dim"], facts["num_key_value_heads"]


def fit_problems(assistant_facts, facts):
    """What keeps an assistant from drafting for a target, as sentences.

    Args:
        assistant_facts: `{"backbone_hidden_size", "vocab_size",
            "layer_types", "kind_caches": {kind: [head_dim, kv_heads]}}`.
        facts: the target's `target_facts`.

    Returns:
        A list of sentences (empty when it fits).
    """
    problems = []
    if assistant_facts["backbone_hidden_size"] != facts["hidden_size"]:
        problems.append(
            f"it projects from and to width "
            f"{assistant_facts['backbone_hidden_size']}, the target's hidden "
            f"size is {facts['hidden_size']}"
        )
    if assistant_facts["vocab_size"] != facts["vocab_size"]:
        problems.append(
            f"its vocabulary has {assistant_facts['vocab_size']} tokens, the "
            f"target's {facts['vocab_size']}"
        )
    types = list(facts.get("layer_types") or [])
    owned = types[: len(types) - int(facts.get("num_kv_shared_layers") or 0)]
    for kind in dict.fromkeys(assistant_facts["layer_types"]):
        if kind not in owned:
            problems.append(
                f"its '{kind}' layers read the target's last '{kind}' layer "
                f"with a cache of its own, and the target has none (its "
                f"layer types: {sorted(set(types))})"
            )
            continue
        want = tuple(assistant_facts["kind_caches"][kind])
        have = tuple(kind_cache(facts, kind))
        if want != have:
            problems.append(
                f"its '{kind}' layers attend with head size {want[0]} over "
                f"{want[1]} KV heads, the target's '{kind}' cache holds "
                f"head size {have[0]} with {have[1]} KV heads"
            )
    return problems


def _facts_problem(facts):
    """What is malformed in an assistant manifest's `facts` (what
    `fit_problems` reads), or None: checked before anything compares
    them, so an altered manifest is refused by name, not by a KeyError."""

    def size(value):
        return is_int(value) and 0 < value <= MAX_DIM

    for key in ("backbone_hidden_size", "vocab_size"):
        if not size(facts.get(key)):
            return f"'{key}' must be a positive integer"
    kinds = facts.get("layer_types")
    if not (isinstance(kinds, list) and 0 < len(kinds) <= MAX_LAYERS and all(
        isinstance(kind, str) and 0 < len(kind) < 64 for kind in kinds
    )):
        return "'layer_types' must be a short list of layer kinds"
    caches = facts.get("kind_caches")
    for kind in kinds:
        cache = caches.get(kind) if isinstance(caches, dict) else None
        if not (isinstance(cache, list) and len(cache) == 2
                and all(size(n) for n in cache)):
            return (
                f"'kind_caches' must give [head size, KV heads] for every "
                f"layer kind ('{kind}')"
            )
    return None


def vllm_config(assistant_facts, backbone_config, dtype, max_len):
    """The assistant's neutral vLLM `config.json`."""
    kinds = assistant_facts["kind_caches"]
    first = kinds[assistant_facts["layer_types"][0]]
    return {
        "model_type": MODEL_TYPE,
        "architectures": [ASSISTANT_ARCHITECTURE],
        "hidden_size": backbone_config["hidden_dim"],
        "backbone_hidden_size": assistant_facts["backbone_hidden_size"],
        "vocab_size": assistant_facts["vocab_size"],
        "num_hidden_layers": len(assistant_facts["layer_types"]),
        "layer_types": list(assistant_facts["layer_types"]),
        "num_attention_heads": backbone_config["num_query_heads"],
        "num_key_value_heads": first[1],
        "head_dim": first[0],
        "intermediate_size": backbone_config["intermediate_dim"],
        "max_position_embeddings": max_len,
        "torch_dtype": dtype,
        "tie_word_embeddings": True,
    }


def read_assistant(directory, verify=True):
    """Reads an assistant artifact's manifest and config, checksums first.

    Args:
        directory: the assistant artifact's directory.
        verify: hash every file against the manifest.

    Returns:
        `(manifest, config)`.

    Raises:
        ArtifactError: it is no assistant artifact, or a newer format.
        IntegrityError: a file is missing, extra or altered.
    """
    path = os.path.abspath(os.fspath(directory))
    manifest = read_json(safe_join(path, MANIFEST_FILE), MAX_MANIFEST_BYTES)
    if not isinstance(manifest, dict) or (
        manifest.get("format") != ASSISTANT_FORMAT
    ):
        raise ArtifactError(
            f"'{path}' is no keras-vllm assistant artifact (its "
            f"{MANIFEST_FILE} has no format '{ASSISTANT_FORMAT}'). Export "
            "the assistant with `keras_vllm.export_assistant()`."
        )
    version = tuple(manifest.get("format_version") or ())
    if not version or version[0] != ASSISTANT_FORMAT_VERSION[0]:
        raise ArtifactError(
            f"'{path}' is an assistant artifact of format version "
            f"{version}; this keras-vllm reads "
            f"{ASSISTANT_FORMAT_VERSION[0]}.x. Re-export it."
        )
    for key in ("files", "target", "weights", "backbone", "causal_lm",
                "facts"):
        if not isinstance(manifest.get(key), dict):
            raise ArtifactError(
                f"'{path}': the assistant manifest has no '{key}' section. "
                "It was altered or not written by keras-vllm; re-export it."
            )
    problem = _facts_problem(manifest["facts"])
    if problem:
        raise ArtifactError(
            f"'{path}': the assistant manifest's 'facts' {problem}. It was "
            "altered or not written by keras-vllm; re-export it."
        )
    if verify:
        verify_files(path, manifest)
    config = read_json(safe_join(path, CONFIG_FILE))
    return manifest, config
