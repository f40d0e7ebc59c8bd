"""Bounds and allowlists for the Keras configs a manifest carries.

Every value of the backbone, tokenizer, preprocessor and sampler configs is
bounded, nested Keras objects are allowlisted, class names must be
keras-hub registered names of the right role, and the parameter count the
backbone config implies is checked before a single variable is allocated.
"""

import math
import re

from keras_vllm import envs
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import VersionSkewError
from keras_vllm.format.checks import fail
from keras_vllm.format.checks import is_int
from keras_vllm.format.names import MAX_CONFIG_DEPTH
from keras_vllm.format.names import MAX_CONFIG_INT
from keras_vllm.format.names import MAX_CONFIG_LIST
from keras_vllm.format.names import MAX_CONFIG_STRING
from keras_vllm.format.names import MAX_PARAMETERS_ENV

_DIMENSION_KEYS = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "num_query_heads",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_dim",
    "intermediate_dim",
    "head_dim",
    "max_sequence_length",
    "num_experts",
    "top_k",
    "moe_intermediate_dim",
    "shared_expert_intermediate_dim",
    "sliding_window",
    "sliding_window_size",
    "text_vocab_size",
    "text_hidden_size",
    "num_hidden_layers",
    "vocab_size_per_layer_input",
    "hidden_size_per_layer_input",
)
# Other keras-hub spellings of the sizes the checks read: a backbone whose
# text decoder is nested in it (Gemma 3n's `language_model`) keeps them
# under its text model's names.
_SIZE_SYNONYMS = {
    "vocabulary_size": ("vocabulary_size", "text_vocab_size"),
    "hidden_dim": ("hidden_dim", "text_hidden_size"),
    "num_layers": ("num_layers", "num_hidden_layers"),
}
# A window size is unused while its family's flag turns the window off;
# transformers then writes 0 (Qwen2-MoE), which keras-hub's converter keeps.
_WINDOW_KEYS = ("sliding_window", "sliding_window_size")
# Sizes whose 0 means "none": Gemma 4 without per-layer embeddings (its
# 26B/31B-like shapes) writes `hidden_size_per_layer_input: 0`.
_ZERO_MEANS_NONE = ("vocab_size_per_layer_input", "hidden_size_per_layer_input")
_WINDOW_FLAGS = ("use_sliding_window_attention", "use_sliding_window")

# The suffix each role's keras-hub class names end with.
ROLE_SUFFIX = {
    "backbone": "Backbone",
    "causal_lm": "CausalLM",
    "tokenizer": "Tokenizer",
    "preprocessor": "Preprocessor",
    "sampler": "Sampler",
}

_REGISTERED_NAME = re.compile(r"keras_hub>([A-Za-z][A-Za-z0-9_]{0,99})")
_CLASS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")

_MODULE = re.compile(r"keras_hub(\.[A-Za-z_][A-Za-z0-9_]{0,99}){1,10}")

_NESTED_ALLOWED = ("DTypePolicy", "FloatDTypePolicy")


def check_config_values(value, where, depth=0):
    """Bounds every value of a JSON config tree (sizes, depth, finiteness).

    Raises:
        ArtifactError: naming the first offending field.
    """
    if depth > MAX_CONFIG_DEPTH:
        fail(f"Invalid manifest: '{where}' is nested too deeply.")
    if isinstance(value, dict):
        if len(value) > MAX_CONFIG_LIST:
            fail(f"Invalid manifest: '{where}' has too many fields.")
        if "class_name" in value or "registered_name" in value:
            # A nested serialized Keras object: Keras would deserialize it,
            # so only plain dtype policies and keras-hub's own registered
            # classes (e.g. a vision encoder) are allowed.
            module = value.get("module")
            registered = value.get("registered_name")
            dtype_policy = (
                module == "keras"
                and value.get("class_name") in _NESTED_ALLOWED
                and registered is None
            )
            keras_hub_class = (
                isinstance(module, str)
                and _MODULE.fullmatch(module) is not None
                and isinstance(registered, str)
                and (
                    _REGISTERED_NAME.fullmatch(registered) is not None
                    and registered.split(">", 1)[1] == value.get("class_name")
                    # A keras-hub class its package never registered (Qwen
                    # 3.5's `Qwen3_5VisionEncoder`) serializes under its bare
                    # name; Keras resolves it from its keras-hub module, and
                    # only keras-hub's (`_MODULE`).
                    or _CLASS_NAME.fullmatch(registered) is not None
                    and registered == value.get("class_name")
                )
            )
            if not (dtype_policy or keras_hub_class):
                fail(
                    f"The artifact's '{where}' is a serialized Keras object "
                    f"('{str(value.get('class_name'))[:100]}' from "
                    f"'{str(value.get('module'))[:100]}') that is not on the "
                    "allowlist (only dtype policies and keras-hub classes may "
                    "be nested in a config). The artifact was altered; "
                    "re-export it."
                )
        for key, item in value.items():
            if not isinstance(key, str) or len(key) > 200:
                fail(f"Invalid manifest: '{where}' has a bad key.")
            check_config_values(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        if len(value) > MAX_CONFIG_LIST:
            fail(f"Invalid manifest: '{where}' is too long.")
        for i, item in enumerate(value):
            check_config_values(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        # Negative values are list indices (MobileNetV5's `msfa_indices`
        # `[-2, -1]`, in every Gemma 3n vision encoder) or -1 for "none";
        # sizes are checked to be positive on their own (`_dims`).
        if not -MAX_CONFIG_INT <= value <= MAX_CONFIG_INT:
            fail(
                f"Invalid manifest: '{where}' is {value}, outside "
                f"[-{MAX_CONFIG_INT}, {MAX_CONFIG_INT}]."
            )
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) > 1e12:
            fail(f"Invalid manifest: '{where}' is {value}.")
    elif isinstance(value, str):
        if len(value) > MAX_CONFIG_STRING:
            fail(f"Invalid manifest: '{where}' is too long.")
    else:
        fail(f"Invalid manifest: '{where}' has a bad type.")


def check_class_name(section, role):
    """Checks a section's class name against the format's allowlist syntax.

    Only `keras_hub>Name` registered names whose class name ends with the
    role's suffix are allowed; `classes.resolve` then checks that keras-hub
    really registered such a class.
    """
    name = section["registered_name"]
    match = _REGISTERED_NAME.fullmatch(name)
    suffix = ROLE_SUFFIX[role]
    if match is None or not match.group(1).endswith(suffix):
        fail(
            f"The artifact's {role} class '{name[:200]}' is not on the "
            f"allowlist (keras-hub registered names 'keras_hub>...{suffix}'). "
            "The artifact was written by another tool or altered; re-export "
            "it."
        )
    class_name = section.get("class_name", match.group(1))
    if class_name != match.group(1):
        fail(
            f"Invalid manifest: '{role}.class_name' ({str(class_name)[:100]}) "
            f"does not match '{role}.registered_name' ({name})."
        )
    module = section.get("module", "keras_hub.src")
    if not isinstance(module, str) or _MODULE.fullmatch(module) is None:
        fail(
            f"The artifact's {role} module '{str(module)[:200]}' is not a "
            "keras-hub module. The artifact was written by another tool or "
            "altered; re-export it."
        )


def max_parameters():
    """The parameter-count limit (`KERAS_VLLM_MAX_PARAMETERS` raises it)."""
    try:
        return envs.MAX_PARAMETERS.get()
    except ValueError as e:
        raise ArtifactError(str(e)) from None


def size(config, name):
    """A backbone config's `vocabulary_size`, `hidden_dim` or `num_layers`,
    under whichever keras-hub spelling it has (None when absent).

    Example:

    >>> size({"text_vocab_size": 262400}, "vocabulary_size")
    262400
    """
    for key in _SIZE_SYNONYMS[name]:
        if config.get(key) is not None:
            return config[key]
    return None


def _dims(config):
    for key in _DIMENSION_KEYS:
        if key not in config or config[key] is None:
            continue
        value = config[key]
        unused_window = key in _WINDOW_KEYS and _window_off(config)
        if unused_window and is_int(value) and value == 0:
            continue
        if key in _ZERO_MEANS_NONE and is_int(value) and value == 0:
            continue
        if not is_int(value) or value <= 0:
            fail(
                f"Invalid manifest: 'backbone.config.{key}' is {value!r}; "
                "sizes must be positive integers."
            )
    dims = {k: config[k] for k in _DIMENSION_KEYS if config.get(k) is not None}
    for name in _SIZE_SYNONYMS:
        value = size(config, name)
        if value is not None:
            dims[name] = value
    return dims


def _window_off(config):
    return any(config.get(flag) is False for flag in _WINDOW_FLAGS)


def estimate_parameters(config):
    """A rough estimate of a backbone's parameter count from its config
    (embeddings, attention, feed-forward, experts and norms per layer)."""
    d = _dims(config)
    hidden = d.get("hidden_dim", 1)
    layers = d.get("num_layers", 1)
    vocab = d.get("vocabulary_size", 1)
    heads = d.get(
        "num_query_heads", d.get("num_heads", d.get("num_attention_heads", 1))
    )
    kv_heads = d.get("num_key_value_heads", heads)
    head_dim = d.get("head_dim", max(hidden // heads, 1))
    experts = d.get("num_experts", 1)
    intermediate = (
        d.get("intermediate_dim", 4 * hidden) * experts
        + d.get("moe_intermediate_dim", 0) * experts
        + d.get("shared_expert_intermediate_dim", 0)
    )
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    per_layer = attention + 3 * hidden * intermediate + hidden * experts
    positions = d.get("max_sequence_length", 0) * hidden
    norms = (4 * layers + 1) * hidden
    # Per-layer input embeddings (Gemma 3n): a table of a slice per layer.
    per_layer_inputs = (
        d.get("vocab_size_per_layer_input", 0)
        * d.get("hidden_size_per_layer_input", 0) * layers
    )
    return (
        2 * vocab * hidden + positions + layers * per_layer + norms
        + per_layer_inputs
    )


def check_parameter_count(manifest):
    estimate = estimate_parameters(manifest["backbone"]["config"])
    limit = max_parameters()
    if estimate > limit:
        fail(
            f"The artifact's backbone config implies about {estimate:.3g} "
            f"parameters, more than the {limit:.3g} this loader allows "
            "without asking. If the artifact is trusted and the machine has "
            f"the memory, set {MAX_PARAMETERS_ENV} to a larger number."
        )
    recorded = manifest.get("parameter_count")
    if recorded is not None and recorded > limit:
        fail(
            f"The manifest records {recorded} parameters, more than the "
            f"{limit} allowed; set {MAX_PARAMETERS_ENV} to load it."
        )
    elements = 0
    for spec in manifest["weights"]["variables"].values():
        elements += math.prod(spec["shape"])
    if elements > limit:
        fail(
            f"The manifest lists {elements} weight values, more than the "
            f"{limit} allowed; set {MAX_PARAMETERS_ENV} to load it."
        )
    weights = manifest["weights"]
    if weights["mode"] == "full":
        total = weights.get("total_variables")
        if total is not None and total != len(weights["variables"]):
            fail(
                f"Invalid manifest: a full export lists "
                f"{len(weights['variables'])} variables but records "
                f"'weights.total_variables' = {total}."
            )
        if recorded is not None and elements > recorded:
            fail(
                f"Invalid manifest: the weight shapes hold {elements} values, "
                f"more than the recorded 'parameter_count' {recorded}. The "
                "manifest was altered; re-export the model."
            )


def check_version_skew(manifest):
    """Refuses an artifact written by another keras-hub major version."""
    written = manifest["written_by"].get("keras_hub")
    if written is None:
        return
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version

        installed = version("keras-hub")
    except (ImportError, PackageNotFoundError):
        return
    if _major(written) != _major(installed):
        raise VersionSkewError(
            f"This artifact was exported with keras-hub {written[:50]}, but "
            f"keras-hub {installed} is installed here; model classes and "
            "configs change between major versions. Install keras-hub "
            f"{_major(written)}.x to load it (`pip install "
            f"'keras-hub=={_major(written)}.*'`), or re-export the model "
            "with this keras-hub."
        )


def _major(version_string):
    head = version_string.split(".", 1)[0]
    return head if head.isdigit() else version_string
