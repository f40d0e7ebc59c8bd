"""The vLLM-facing files of an artifact: `config.json` and
`generation_config.json`, their writers beside their allowed keys.

`config.json` is neutral: it carries our own `model_type` and architecture
(never a borrowed Hugging Face model name) and exactly the numbers vLLM and
tpu-inference read to validate the model and size its KV cache. Readers
refuse every key keras-vllm never writes (`auto_map`,
`quantization_config`, ... could change how vLLM or transformers treat the
model).
"""

import warnings

from keras_vllm.format.checks import check_id_list
from keras_vllm.format.configs import size
from keras_vllm.format.checks import check_token_id
from keras_vllm.format.checks import fail
from keras_vllm.format.checks import is_int
from keras_vllm.format.checks import is_number
from keras_vllm.format.names import ARCHITECTURE
from keras_vllm.format.names import CONFIG_FILE
from keras_vllm.format.names import GENERATION_CONFIG_FILE
from keras_vllm.format.names import IMAGE_ARCHITECTURE
from keras_vllm.format.names import MAX_DIM
from keras_vllm.format.names import MODEL_TYPE
from keras_vllm.format import state_layers

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
    # 1.7: per-kind KV cache shapes and KV sharing (docs/FORMAT.md).
    "global_head_dim": _INT,
    "attention_k_eq_v": bool,
    "num_global_key_value_heads": _INT,
    "num_kv_shared_layers": _INT,
    # 1.10: layers with a recurrent state (`format.state_layers`).
    "recurrent_state_layers": list,
    "recurrent_state_shapes": list,
    "recurrent_state_dtypes": list,
}
# The keys of format 1.7 (refused in older artifacts, which never had them).
_KV_KEYS_1_7 = (
    "global_head_dim",
    "attention_k_eq_v",
    "num_global_key_value_heads",
    "num_kv_shared_layers",
)

# The sizes every `config.json` has (positive integers).
_SIZE_KEYS = (
    "hidden_size",
    "vocab_size",
    "max_position_embeddings",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
_GENERATION_CONFIG_KEYS = {
    "eos_token_id": list,
    "bos_token_id": _INT,
    "temperature": float,
    "top_k": _INT,
    "top_p": float,
    "do_sample": bool,
}


# KerasHub sampler -> the vLLM sampling parameters it corresponds to.
_SAMPLING = {
    "keras_hub>GreedySampler": lambda c: {"temperature": 0.0},
    "keras_hub>RandomSampler": lambda c: {"temperature": c["temperature"]},
    "keras_hub>TopKSampler": lambda c: {
        "temperature": c["temperature"],
        "top_k": c["k"],
    },
    "keras_hub>TopPSampler": lambda c: {
        "temperature": c["temperature"],
        "top_p": c["p"],
        **({"top_k": c["k"]} if c.get("k") else {}),
    },
}


def vllm_config(
    *,
    hidden_size,
    vocab_size,
    max_sequence_length,
    dtype,
    tie_word_embeddings,
    stop_token_ids,
    bos_token_id,
    pad_token_id,
    kv_layout,
    serves_images=False,
):
    """Builds the neutral `config.json` dict.

    Args:
        kv_layout: the per-layer KV cache fields (`num_hidden_layers`,
            `num_attention_heads`, `num_key_value_heads`, `head_dim`, and
            `layer_types` / `sliding_window` when a layer has a window;
            since 1.7 `global_head_dim`, `attention_k_eq_v` +
            `num_global_key_value_heads` and `num_kv_shared_layers` when
            full-attention layers have another shape or layers share
            caches; see `keras_vllm.export.kv_layout`).
        serves_images: whether the artifact serves images (1.10): its
            architecture is then `IMAGE_ARCHITECTURE`, the class vLLM finds
            the multimodal processor on.
        The others are the backbone's and tokenizer's own numbers.
    """
    config = {
        "architectures": [IMAGE_ARCHITECTURE if serves_images else ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": int(hidden_size),
        "vocab_size": int(vocab_size),
        "max_position_embeddings": int(max_sequence_length),
        "torch_dtype": dtype,
        "tie_word_embeddings": bool(tie_word_embeddings),
        "eos_token_id": list(stop_token_ids),
    }
    if bos_token_id is not None:
        config["bos_token_id"] = int(bos_token_id)
    if pad_token_id is not None:
        config["pad_token_id"] = int(pad_token_id)
    config.update(kv_layout)
    _check_typed(config, _VLLM_CONFIG_KEYS, CONFIG_FILE)
    return config


def generation_config(sampler_name, sampler_config, stop_token_ids,
                      bos_token_id):
    """Builds `generation_config.json` (vLLM's default sampling parameters).

    Samplers without a vLLM equivalent (beam, contrastive, speculative) are
    reported with a warning and leave vLLM's defaults in place.

    Returns:
        `(config, mapped)`: `mapped` is whether vLLM reproduces the sampler.
    """
    config = {"eos_token_id": list(stop_token_ids)}
    if bos_token_id is not None:
        config["bos_token_id"] = int(bos_token_id)
    mapping = _SAMPLING.get(sampler_name)
    if mapping is None:
        warnings.warn(
            f"The model's sampler {sampler_name} has no vLLM equivalent; the "
            "artifact records it, but vLLM will sample with its own defaults "
            "unless a request sets sampling parameters. Compile the model "
            "with a greedy, top_k, top_p or random sampler to serve it.",
            stacklevel=3,
        )
        return config, False
    sampling = mapping(sampler_config)
    config.update(sampling)
    config["do_sample"] = sampling.get("temperature", 1.0) > 0
    return config, True


def _check_typed(obj, schema, what):
    if not isinstance(obj, dict):
        fail(f"{what} must be a JSON object.")
    for key, value in obj.items():
        kind = schema.get(key)
        if kind is None:
            fail(
                f"{what} has the field '{str(key)[:100]}', which keras-vllm "
                "never writes. The file was altered; re-export the model."
            )
        ok = (
            is_int(value)
            if kind is _INT
            else is_number(value)
            if kind is float
            else isinstance(value, kind)
        )
        if not ok:
            fail(f"{what}: '{key}' has the wrong type ({type(value).__name__}).")


def _positive(value, what, limit=MAX_DIM):
    if not (is_int(value) and 0 < value <= limit):
        fail(f"{what} is {str(value)[:50]}, expected 1..{limit}.")


def check_vllm_config(config, manifest, vocab):
    what = CONFIG_FILE
    _check_typed(config, _VLLM_CONFIG_KEYS, what)
    for key in ("architectures", "model_type") + _SIZE_KEYS:
        if key not in config:
            fail(f"{what} lacks '{key}'; re-export the model.")
    served = manifest.get("modalities", {}).get("served", ["text"])
    architecture = IMAGE_ARCHITECTURE if "image" in served else ARCHITECTURE
    if config["architectures"] != [architecture] or (
        config["model_type"] != MODEL_TYPE
    ):
        fail(
            f"{what} names architectures {str(config['architectures'])[:100]} "
            f"/ model_type '{str(config['model_type'])[:100]}', not "
            f"'{architecture}' / '{MODEL_TYPE}'."
        )
    for key in _SIZE_KEYS:
        _positive(config[key], f"{what}: '{key}'")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        fail(
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
        ("hidden_size", size(backbone, "hidden_dim"), "backbone hidden_dim"),
        ("vocab_size", size(backbone, "vocabulary_size"), "backbone vocabulary"),
        ("num_hidden_layers", size(backbone, "num_layers"), "backbone layers"),
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
            fail(
                f"{what} and the manifest disagree: '{key}' is "
                f"{str(config[key])[:50]} in {what} but {str(expected)[:50]} "
                f"({source}). One of them was altered; re-export the model."
            )
    if "layer_types" in config:
        types = config["layer_types"]
        if len(types) != config["num_hidden_layers"] or not all(
            t in ("sliding_attention", "full_attention") for t in types
        ):
            fail(f"{what}: 'layer_types' is malformed.")
        if "sliding_window" not in config:
            fail(f"{what}: 'layer_types' without 'sliding_window'.")
    if "sliding_window" in config:
        _positive(config["sliding_window"], f"{what}: 'sliding_window'")
    _check_kv_kinds(config, manifest)
    state_layers.validate(
        config, manifest.get("format_version", ()), what
    )
    check_id_list(config["eos_token_id"], vocab, f"{what}: 'eos_token_id'", 1000)
    check_token_id(config.get("bos_token_id"), vocab, f"{what}: 'bos_token_id'")
    check_token_id(config.get("pad_token_id"), vocab, f"{what}: 'pad_token_id'")


def _check_kv_kinds(config, manifest):
    """The 1.7 per-kind KV fields: only in 1.7+ artifacts, with
    `layer_types`, in range."""
    what = CONFIG_FILE
    present = [key for key in _KV_KEYS_1_7 if key in config]
    if not present:
        return
    if tuple(manifest.get("format_version", ())) < (1, 7):
        fail(
            f"{what} has '{present[0]}', which format versions before 1.7 "
            "never write. The file was altered; re-export the model."
        )
    if "layer_types" not in config:
        fail(f"{what}: '{present[0]}' without 'layer_types'.")
    for key in ("global_head_dim", "num_global_key_value_heads"):
        if key in config:
            _positive(config[key], f"{what}: '{key}'")
    if ("num_global_key_value_heads" in config) != bool(
        config.get("attention_k_eq_v")
    ):
        fail(
            f"{what}: 'num_global_key_value_heads' and 'attention_k_eq_v' "
            "come together."
        )
    heads = config.get("num_global_key_value_heads")
    if heads and config["num_attention_heads"] % heads:
        fail(
            f"{what}: {config['num_attention_heads']} attention heads are not "
            f"a multiple of {heads} global key/value heads."
        )
    shared = config.get("num_kv_shared_layers")
    if shared is not None and not (
        is_int(shared) and 0 < shared < config["num_hidden_layers"]
    ):
        fail(
            f"{what}: 'num_kv_shared_layers' is {str(shared)[:50]}, expected "
            f"1..{config['num_hidden_layers'] - 1}."
        )


def check_generation_config(config, manifest, vocab):
    what = GENERATION_CONFIG_FILE
    _check_typed(config, _GENERATION_CONFIG_KEYS, what)
    check_id_list(
        config.get("eos_token_id", []), vocab, f"{what}: 'eos_token_id'", 1000
    )
    check_token_id(config.get("bos_token_id"), vocab, f"{what}: 'bos_token_id'")
    temperature = config.get("temperature", 1.0)
    if not 0 <= temperature <= 1000:
        fail(f"{what}: 'temperature' is {temperature}, expected 0..1000.")
    top_p = config.get("top_p", 1.0)
    if not 0 < top_p <= 1:
        fail(f"{what}: 'top_p' is {top_p}, expected a number in (0, 1].")
    top_k = config.get("top_k", 0)
    if not -1 <= top_k <= MAX_DIM:
        fail(f"{what}: 'top_k' is {top_k}, expected -1..{MAX_DIM}.")
