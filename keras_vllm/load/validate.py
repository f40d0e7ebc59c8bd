"""Deep validation of an artifact, in plain Python.

`artifact.open_artifact` checks the manifest's own structure and every
file's checksum. This module checks what the files say against each other:
class names against the format's allowlist syntax, every config value
against bounds, the parameter count the backbone config implies (before a
single variable is allocated), `config.json`, `generation_config.json`,
`golden.json`, the tokenizer files and the orbax tree metadata against the
manifest, and the keras-hub version that wrote the artifact.

It imports neither JAX, Keras nor vLLM, so `KerasVllmEngine.from_export`
runs it in the parent process before vLLM forks, and `load_causal_lm` runs
it before building anything.

```python
manifest = artifact.open_artifact(path)   # structure + checksums
validate.validate_artifact(path, manifest)  # consistency + bounds
```
"""

import hashlib
import json
import math
import os
import re

from keras_vllm import artifact
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import VersionSkewError

# Any integer in a backbone/tokenizer/preprocessor/sampler config above this
# is refused before a layer is built (hostile "huge dimension" manifests).
MAX_CONFIG_INT = 1 << 22
MAX_CONFIG_DEPTH = 16
MAX_CONFIG_STRING = 100_000
MAX_CONFIG_LIST = 10_000
# The largest backbone loaded without asking (estimated from its config, so
# a hostile config cannot make the loader allocate unbounded memory). Set
# KERAS_VLLM_MAX_PARAMETERS to raise it.
DEFAULT_MAX_PARAMETERS = 1 << 34
MAX_PARAMETERS_ENV = "KERAS_VLLM_MAX_PARAMETERS"
MAX_CHAT_TEMPLATE_BYTES = 1 << 20
MAX_GOLDEN_RECORDS = 1000
MAX_GOLDEN_IDS = 100_000

# Backbone config keys that are sizes: positive integers when present.
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
)

# The suffix each role's keras-hub class names end with.
_ROLE_SUFFIX = {
    "backbone": "Backbone",
    "causal_lm": "CausalLM",
    "tokenizer": "Tokenizer",
    "preprocessor": "Preprocessor",
    "sampler": "Sampler",
}
_REGISTERED_NAME = re.compile(r"keras_hub>([A-Za-z][A-Za-z0-9_]{0,99})")
_MODULE = re.compile(r"keras_hub(\.[A-Za-z_][A-Za-z0-9_]{0,99}){1,10}")
# The files of an orbax (OCDBT) PyTree checkpoint.
_WEIGHT_FILE = re.compile(
    r"(_METADATA|_CHECKPOINT_METADATA|_sharding|commit_success\.txt"
    r"|descriptor/descriptor\.pbtxt|array_metadatas/process_\d{1,6}"
    r"|(ocdbt\.process_\d{1,6}/)?(manifest\.ocdbt|d/[0-9a-f]{32}))"
)
_ASSET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")

# `config.json`: the only keys keras-vllm writes, with their types. Any
# other key (`auto_map`, `quantization_config`...) could change how vLLM or
# transformers treat the model, so it is refused.
_NESTED_ALLOWED = ("DTypePolicy", "FloatDTypePolicy")
_INT = "int"
_VLLM_CONFIG_KEYS = {
    "architectures": list,
    "model_type": str,
    "hidden_size": _INT,
    "vocab_size": _INT,
    "max_position_embeddings": _INT,
    "torch_dtype": str,
    "tie_word_embeddings": bool,
    "eos_token_id": list,
    "bos_token_id": _INT,
    "pad_token_id": _INT,
    "num_hidden_layers": _INT,
    "num_attention_heads": _INT,
    "num_key_value_heads": _INT,
    "head_dim": _INT,
    "layer_types": list,
    "sliding_window": _INT,
}
_GENERATION_CONFIG_KEYS = {
    "eos_token_id": list,
    "bos_token_id": _INT,
    "temperature": float,
    "top_k": _INT,
    "top_p": float,
    "do_sample": bool,
}


def _fail(message):
    raise ArtifactError(message)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def check_config_values(value, where, depth=0):
    """Bounds every value of a JSON config tree (sizes, depth, finiteness).

    Raises:
        ArtifactError: naming the first offending field.
    """
    if depth > MAX_CONFIG_DEPTH:
        _fail(f"Invalid manifest: '{where}' is nested too deeply.")
    if isinstance(value, dict):
        if len(value) > MAX_CONFIG_LIST:
            _fail(f"Invalid manifest: '{where}' has too many fields.")
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
                and _REGISTERED_NAME.fullmatch(registered) is not None
                and registered.split(">", 1)[1] == value.get("class_name")
            )
            if not (dtype_policy or keras_hub_class):
                _fail(
                    f"The artifact's '{where}' is a serialized Keras object "
                    f"('{str(value.get('class_name'))[:100]}' from "
                    f"'{str(value.get('module'))[:100]}') that is not on the "
                    "allowlist (only dtype policies and keras-hub classes may "
                    "be nested in a config). The artifact was altered; "
                    "re-export it."
                )
        for key, item in value.items():
            if not isinstance(key, str) or len(key) > 200:
                _fail(f"Invalid manifest: '{where}' has a bad key.")
            check_config_values(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        if len(value) > MAX_CONFIG_LIST:
            _fail(f"Invalid manifest: '{where}' is too long.")
        for i, item in enumerate(value):
            check_config_values(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -1 <= value <= MAX_CONFIG_INT:
            _fail(
                f"Invalid manifest: '{where}' is {value}, outside "
                f"[-1, {MAX_CONFIG_INT}]."
            )
    elif isinstance(value, float):
        if not math.isfinite(value) or abs(value) > 1e12:
            _fail(f"Invalid manifest: '{where}' is {value}.")
    elif isinstance(value, str):
        if len(value) > MAX_CONFIG_STRING:
            _fail(f"Invalid manifest: '{where}' is too long.")
    else:
        _fail(f"Invalid manifest: '{where}' has a bad type.")


def check_class_name(section, role):
    """Checks a section's class name against the format's allowlist syntax.

    Only `keras_hub>Name` registered names whose class name ends with the
    role's suffix are allowed; `classes.resolve` then checks that keras-hub
    really registered such a class.
    """
    name = section["registered_name"]
    match = _REGISTERED_NAME.fullmatch(name)
    suffix = _ROLE_SUFFIX[role]
    if match is None or not match.group(1).endswith(suffix):
        _fail(
            f"The artifact's {role} class '{name[:200]}' is not on the "
            f"allowlist (keras-hub registered names 'keras_hub>...{suffix}'). "
            "The artifact was written by another tool or altered; re-export "
            "it."
        )
    class_name = section.get("class_name", match.group(1))
    if class_name != match.group(1):
        _fail(
            f"Invalid manifest: '{role}.class_name' ({str(class_name)[:100]}) "
            f"does not match '{role}.registered_name' ({name})."
        )
    module = section.get("module", "keras_hub.src")
    if not isinstance(module, str) or _MODULE.fullmatch(module) is None:
        _fail(
            f"The artifact's {role} module '{str(module)[:200]}' is not a "
            "keras-hub module. The artifact was written by another tool or "
            "altered; re-export it."
        )


def max_parameters():
    """The parameter-count limit (`KERAS_VLLM_MAX_PARAMETERS` raises it)."""
    value = os.environ.get(MAX_PARAMETERS_ENV)
    if not value:
        return DEFAULT_MAX_PARAMETERS
    try:
        return int(float(value))
    except ValueError:
        raise ArtifactError(
            f"{MAX_PARAMETERS_ENV}={value!r} is not a number."
        ) from None


def _dims(config):
    for key in _DIMENSION_KEYS:
        if key not in config or config[key] is None:
            continue
        value = config[key]
        if not _is_int(value) or value <= 0:
            _fail(
                f"Invalid manifest: 'backbone.config.{key}' is {value!r}; "
                "sizes must be positive integers."
            )
    return {k: config[k] for k in _DIMENSION_KEYS if config.get(k) is not None}


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
    return 2 * vocab * hidden + positions + layers * per_layer + norms


def _check_parameter_count(manifest):
    estimate = estimate_parameters(manifest["backbone"]["config"])
    limit = max_parameters()
    if estimate > limit:
        _fail(
            f"The artifact's backbone config implies about {estimate:.3g} "
            f"parameters, more than the {limit:.3g} this loader allows "
            "without asking. If the artifact is trusted and the machine has "
            f"the memory, set {MAX_PARAMETERS_ENV} to a larger number."
        )
    recorded = manifest.get("parameter_count")
    if recorded is not None and recorded > limit:
        _fail(
            f"The manifest records {recorded} parameters, more than the "
            f"{limit} allowed; set {MAX_PARAMETERS_ENV} to load it."
        )
    elements = 0
    for spec in manifest["weights"]["variables"].values():
        elements += math.prod(spec["shape"])
    if elements > limit:
        _fail(
            f"The manifest lists {elements} weight values, more than the "
            f"{limit} allowed; set {MAX_PARAMETERS_ENV} to load it."
        )
    weights = manifest["weights"]
    if weights["mode"] == "full":
        total = weights.get("total_variables")
        if total is not None and total != len(weights["variables"]):
            _fail(
                f"Invalid manifest: a full export lists "
                f"{len(weights['variables'])} variables but records "
                f"'weights.total_variables' = {total}."
            )
        if recorded is not None and elements > recorded:
            _fail(
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


def _read(path, rel, manifest):
    if rel not in manifest["files"]:
        _fail(f"The artifact has no '{rel}'; re-export the model.")
    return artifact.read_json(artifact.safe_join(path, rel), what=rel)


def _check_required_files(manifest):
    files = manifest["files"]
    mode = manifest["weights"]["mode"]
    required = [
        artifact.GENERATION_CONFIG_FILE,
        artifact.GOLDEN_FILE,
        artifact.TOKENIZER_CONFIG_FILE,
    ]
    if manifest.get("servable", True):
        required.append(artifact.CONFIG_FILE)
    for rel in required:
        if rel not in files:
            raise IntegrityError(
                f"Artifact file '{rel}' is missing from the manifest. The "
                "artifact is incomplete; re-export the model."
            )
    top_level = {
        artifact.CONFIG_FILE,
        artifact.GENERATION_CONFIG_FILE,
        artifact.GOLDEN_FILE,
        artifact.CHAT_TEMPLATE_FILE,
        artifact.TOKENIZER_CONFIG_FILE,
    }
    has_weights = False
    for rel in files:
        if rel.startswith(artifact.WEIGHTS_DIR + "/"):
            has_weights = True
            if _WEIGHT_FILE.fullmatch(rel[len(artifact.WEIGHTS_DIR) + 1 :]) is None:
                _fail(
                    f"The artifact holds '{rel[:200]}', which is not a file "
                    "an orbax checkpoint consists of. Remove it, or re-export "
                    "the model."
                )
        elif rel in top_level or (
            rel.startswith(artifact.TOKENIZER_ASSETS_DIR + "/")
            and rel.count("/") == 2
        ):
            pass
        else:
            _fail(
                f"The artifact holds '{rel[:200]}', which is not part of the "
                "keras-vllm format. Remove it, or re-export the model."
            )
    if has_weights != (mode != "preset"):
        _fail(
            f"Invalid manifest: 'weights.mode' is '{mode}' but the artifact "
            + ("has" if has_weights else "has no")
            + f" '{artifact.WEIGHTS_DIR}/' files."
        )


def _check_token_id(value, vocab, where, nullable=True):
    if value is None and nullable:
        return
    if not _is_int(value) or not 0 <= value < vocab:
        _fail(
            f"Invalid artifact: {where} is {str(value)[:50]}, not a token id "
            f"below the vocabulary size {vocab}."
        )


def _check_id_list(values, vocab, where, limit=MAX_GOLDEN_IDS):
    if not isinstance(values, list) or len(values) > limit:
        _fail(f"Invalid artifact: {where} must be a list of token ids.")
    for value in values:
        _check_token_id(value, vocab, where, nullable=False)


def _check_tokenizer(manifest, vocab):
    section = manifest["tokenizer"]
    files = manifest["files"]
    names = section.get("assets")
    if not isinstance(names, list) or len(names) > 100:
        _fail("Invalid manifest: 'tokenizer.assets' must be a list of names.")
    for name in names:
        if not isinstance(name, str) or _ASSET_NAME.fullmatch(name) is None:
            _fail(
                f"Invalid manifest: tokenizer asset {str(name)[:100]!r} is not "
                "a plain file name."
            )
    prefix = artifact.TOKENIZER_ASSETS_DIR + "/"
    on_disk = sorted(r[len(prefix):] for r in files if r.startswith(prefix))
    if sorted(names) != on_disk or len(set(names)) != len(names):
        _fail(
            "The tokenizer assets on disk differ from those the manifest "
            f"lists ({on_disk[:10]} vs {sorted(map(str, names))[:10]})."
        )
    fingerprint = section.get("fingerprint")
    if fingerprint is not None:
        digest = hashlib.sha256()
        for name in sorted(names):
            digest.update(name.encode())
            digest.update(files[prefix + name]["sha256"].encode())
        digest.update(json.dumps(section["config"], sort_keys=True).encode())
        if digest.hexdigest() != fingerprint:
            raise IntegrityError(
                "The tokenizer assets or config do not match the tokenizer "
                "fingerprint recorded at export; they do not belong to this "
                "model. Re-export it."
            )
    for key in ("start_token_id", "end_token_id", "pad_token_id"):
        _check_token_id(section.get(key), vocab, f"'tokenizer.{key}'")
    probes = section.get("golden", [])
    if not isinstance(probes, list) or len(probes) > MAX_GOLDEN_RECORDS:
        _fail("Invalid manifest: 'tokenizer.golden' must be a list.")
    for probe in probes:
        if not (
            isinstance(probe, dict)
            and isinstance(probe.get("text"), str)
            and len(probe["text"]) < 100_000
        ):
            _fail("Invalid manifest: a 'tokenizer.golden' entry is malformed.")
        _check_id_list(probe.get("ids"), vocab, "'tokenizer.golden[].ids'")


def _check_typed(obj, schema, what):
    if not isinstance(obj, dict):
        _fail(f"{what} must be a JSON object.")
    for key, value in obj.items():
        kind = schema.get(key)
        if kind is None:
            _fail(
                f"{what} has the field '{str(key)[:100]}', which keras-vllm "
                "never writes. The file was altered; re-export the model."
            )
        ok = (
            _is_int(value)
            if kind is _INT
            else _is_number(value)
            if kind is float
            else isinstance(value, kind)
        )
        if not ok:
            _fail(f"{what}: '{key}' has the wrong type ({type(value).__name__}).")


def _positive(value, what, limit=artifact.MAX_DIM):
    if not (_is_int(value) and 0 < value <= limit):
        _fail(f"{what} is {str(value)[:50]}, expected 1..{limit}.")


def _check_vllm_config(path, manifest, vocab):
    what = artifact.CONFIG_FILE
    config = _read(path, what, manifest)
    _check_typed(config, _VLLM_CONFIG_KEYS, what)
    for key in (
        "architectures",
        "model_type",
        "hidden_size",
        "vocab_size",
        "max_position_embeddings",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    ):
        if key not in config:
            _fail(f"{what} lacks '{key}'; re-export the model.")
    if config["architectures"] != [artifact.ARCHITECTURE] or (
        config["model_type"] != artifact.MODEL_TYPE
    ):
        _fail(
            f"{what} names architectures {str(config['architectures'])[:100]} "
            f"/ model_type '{str(config['model_type'])[:100]}', not "
            f"'{artifact.ARCHITECTURE}' / '{artifact.MODEL_TYPE}'."
        )
    for key in (
        "hidden_size",
        "vocab_size",
        "max_position_embeddings",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    ):
        _positive(config[key], f"{what}: '{key}'")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        _fail(
            f"{what}: {config['num_attention_heads']} attention heads are not "
            f"a multiple of {config['num_key_value_heads']} key/value heads."
        )
    backbone = manifest["backbone"]["config"]
    heads = next(
        (
            backbone[k]
            for k in ("num_query_heads", "num_heads", "num_attention_heads")
            if backbone.get(k) is not None
        ),
        None,
    )
    pairs = [
        ("hidden_size", backbone.get("hidden_dim"), "backbone hidden_dim"),
        ("vocab_size", backbone.get("vocabulary_size"), "backbone vocabulary"),
        ("num_hidden_layers", backbone.get("num_layers"), "backbone layers"),
        ("num_attention_heads", heads, "backbone query heads"),
        (
            "num_key_value_heads",
            backbone.get("num_key_value_heads"),
            "backbone key/value heads",
        ),
        ("head_dim", backbone.get("head_dim"), "backbone head_dim"),
        (
            "max_position_embeddings",
            manifest["max_sequence_length"],
            "manifest max_sequence_length",
        ),
        ("torch_dtype", manifest["dtype"], "manifest dtype"),
        ("eos_token_id", manifest["stop_token_ids"], "manifest stop_token_ids"),
        (
            "bos_token_id",
            manifest["tokenizer"].get("start_token_id"),
            "tokenizer start_token_id",
        ),
        (
            "pad_token_id",
            manifest["tokenizer"].get("pad_token_id"),
            "tokenizer pad_token_id",
        ),
        (
            "tie_word_embeddings",
            backbone.get("tie_word_embeddings"),
            "backbone tie_word_embeddings",
        ),
    ]
    for key, expected, source in pairs:
        if expected is None or key not in config:
            continue
        if config[key] != expected:
            _fail(
                f"{what} and the manifest disagree: '{key}' is "
                f"{str(config[key])[:50]} in {what} but {str(expected)[:50]} "
                f"({source}). One of them was altered; re-export the model."
            )
    if "layer_types" in config:
        types = config["layer_types"]
        if len(types) != config["num_hidden_layers"] or not all(
            t in ("sliding_attention", "full_attention") for t in types
        ):
            _fail(f"{what}: 'layer_types' is malformed.")
        if "sliding_window" not in config:
            _fail(f"{what}: 'layer_types' without 'sliding_window'.")
    if "sliding_window" in config:
        _positive(config["sliding_window"], f"{what}: 'sliding_window'")
    _check_id_list(config["eos_token_id"], vocab, f"{what}: 'eos_token_id'", 1000)
    _check_token_id(config.get("bos_token_id"), vocab, f"{what}: 'bos_token_id'")
    _check_token_id(config.get("pad_token_id"), vocab, f"{what}: 'pad_token_id'")


def _check_generation_config(path, manifest, vocab):
    what = artifact.GENERATION_CONFIG_FILE
    config = _read(path, what, manifest)
    _check_typed(config, _GENERATION_CONFIG_KEYS, what)
    _check_id_list(
        config.get("eos_token_id", []), vocab, f"{what}: 'eos_token_id'", 1000
    )
    _check_token_id(config.get("bos_token_id"), vocab, f"{what}: 'bos_token_id'")
    temperature = config.get("temperature", 1.0)
    if not 0 <= temperature <= 1000:
        _fail(f"{what}: 'temperature' is {temperature}, expected 0..1000.")
    top_p = config.get("top_p", 1.0)
    if not 0 < top_p <= 1:
        _fail(f"{what}: 'top_p' is {top_p}, expected a number in (0, 1].")
    top_k = config.get("top_k", 0)
    if not -1 <= top_k <= artifact.MAX_DIM:
        _fail(f"{what}: 'top_k' is {top_k}, expected -1..{artifact.MAX_DIM}.")


def _check_golden(path, manifest, vocab):
    what = artifact.GOLDEN_FILE
    golden = _read(path, what, manifest)
    if not isinstance(golden, dict) or set(golden) != {
        "max_new_tokens",
        "outputs",
    }:
        _fail(
            f"{what} must be an object with 'max_new_tokens' and 'outputs'; "
            "re-export the model."
        )
    steps = golden["max_new_tokens"]
    if not (_is_int(steps) and 0 <= steps <= 100_000):
        _fail(f"{what}: 'max_new_tokens' is {str(steps)[:50]}, out of range.")
    outputs = golden["outputs"]
    if not isinstance(outputs, list) or len(outputs) > MAX_GOLDEN_RECORDS:
        _fail(f"{what}: 'outputs' must be a list of records.")
    for record in outputs:
        if not isinstance(record, dict) or not isinstance(
            record.get("prompt"), str
        ):
            _fail(f"{what}: a record is malformed (needs a string 'prompt').")
        _check_id_list(record.get("prompt_ids"), vocab, f"{what}: 'prompt_ids'")
        _check_id_list(record.get("output_ids"), vocab, f"{what}: 'output_ids'")
        if len(record["output_ids"]) > steps:
            _fail(f"{what}: a record has more output ids than 'max_new_tokens'.")


def _check_tokenizer_config(path, manifest):
    what = artifact.TOKENIZER_CONFIG_FILE
    stored = _read(path, what, manifest)
    section = manifest["tokenizer"]
    if not isinstance(stored, dict) or any(
        stored.get(key) != section.get(key)
        for key in ("class_name", "registered_name", "module", "config")
    ):
        _fail(
            f"{what} and the manifest's tokenizer section disagree. One of "
            "them was altered; re-export the model."
        )


def _check_chat_template(path, manifest):
    rel = artifact.CHAT_TEMPLATE_FILE
    if rel not in manifest["files"]:
        return
    if manifest["files"][rel]["bytes"] > MAX_CHAT_TEMPLATE_BYTES:
        _fail(f"{rel} is larger than {MAX_CHAT_TEMPLATE_BYTES} bytes.")
    with open(artifact.safe_join(path, rel), "rb") as f:
        data = f.read(MAX_CHAT_TEMPLATE_BYTES + 1)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        _fail(f"{rel} is not UTF-8 text; re-export the model.")


def _check_weight_tree(path, manifest):
    """Checks the orbax tree metadata (plain JSON) against the manifest, so
    orbax is only asked for exactly the variables the manifest lists."""
    if manifest["weights"]["mode"] == "preset":
        return
    rel = artifact.WEIGHTS_DIR + "/_METADATA"
    metadata = _read(path, rel, manifest)
    tree = metadata.get("tree_metadata") if isinstance(metadata, dict) else None
    if not isinstance(tree, dict):
        _fail(f"{rel} has no 'tree_metadata'; the weights are damaged.")
    stored = set()
    for entry in tree.values():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        if not isinstance(keys, list) or not all(
            isinstance(k, dict) and isinstance(k.get("key"), str) for k in keys
        ):
            _fail(f"{rel} is malformed; the weights are damaged.")
        stored.add("/".join(k["key"] for k in keys))
    listed = set(manifest["weights"]["variables"])
    if stored != listed:
        diff = sorted(stored ^ listed)
        _fail(
            f"The weights checkpoint and the manifest list different "
            f"variables (e.g. '{diff[0][:200]}'). The artifact was altered; "
            "re-export it."
        )


def validate_artifact(path, manifest):
    """Cross-checks an opened artifact's files and manifest (plain Python).

    Args:
        path: the artifact directory.
        manifest: the manifest returned by `artifact.open_artifact(path)`.

    Raises:
        ArtifactError: (or a subclass) naming what is inconsistent, out of
            bounds or off the allowlist, and what to do.
    """
    path = os.fspath(path)
    check_version_skew(manifest)
    for role in _ROLE_SUFFIX:
        section = manifest[role]
        check_class_name(section, role)
        check_config_values(section["config"], f"{role}.config")
    _check_parameter_count(manifest)
    vocab = manifest["backbone"]["config"].get("vocabulary_size")
    if not _is_int(vocab) or vocab <= 0:
        _fail(
            "Invalid manifest: 'backbone.config.vocabulary_size' must be a "
            "positive integer."
        )
    _check_id_list(manifest["stop_token_ids"], vocab, "'stop_token_ids'", 1000)
    _check_required_files(manifest)
    _check_tokenizer(manifest, vocab)
    _check_tokenizer_config(path, manifest)
    if artifact.CONFIG_FILE in manifest["files"]:
        _check_vllm_config(path, manifest, vocab)
    _check_generation_config(path, manifest, vocab)
    _check_golden(path, manifest, vocab)
    _check_chat_template(path, manifest)
    _check_weight_tree(path, manifest)
    return manifest
