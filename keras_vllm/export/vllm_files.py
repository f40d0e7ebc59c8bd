"""The vLLM-facing files of an artifact: `config.json` and
`generation_config.json`.

`config.json` is neutral: it carries our own `model_type` and architecture
(never a borrowed Hugging Face model name) and exactly the numbers vLLM and
tpu-inference read to validate the model and size its KV cache.
"""

import warnings

from keras_vllm import artifact
from keras_vllm.errors import UnsupportedModelError

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


def kv_layout(backbone):
    """Per-layer KV cache facts from the registry of paged layers.

    Returns:
        A dict of `config.json` fields, or raises `UnsupportedModelError`.
    """
    from keras_vllm.layers.registry import kv_cache_specs

    specs = kv_cache_specs(backbone)
    if not specs:
        raise UnsupportedModelError(
            f"{type(backbone).__name__} has no attention layers keras-vllm "
            "can find."
        )
    first = specs[0]
    for spec in specs[1:]:
        if (spec.num_query_heads, spec.num_kv_heads, spec.head_dim) != (
            first.num_query_heads,
            first.num_kv_heads,
            first.head_dim,
        ):
            raise UnsupportedModelError(
                "Attention layers with different head counts or sizes are not "
                "supported by vLLM's uniform KV cache."
            )
    windows = [spec.sliding_window for spec in specs]
    fields = {
        "num_hidden_layers": len(specs),
        "num_attention_heads": first.num_query_heads,
        "num_key_value_heads": first.num_kv_heads,
        "head_dim": first.head_dim,
    }
    if any(w is not None for w in windows):
        fields["layer_types"] = [
            "sliding_attention" if w is not None else "full_attention"
            for w in windows
        ]
        fields["sliding_window"] = max(w for w in windows if w is not None)
    return fields


def vllm_config(backbone, dtype, max_sequence_length, stop_token_ids, tokenizer):
    """Builds the neutral `config.json` dict."""
    config = {
        "architectures": [artifact.ARCHITECTURE],
        "model_type": artifact.MODEL_TYPE,
        "hidden_size": int(backbone.hidden_dim),
        "vocab_size": int(backbone.vocabulary_size),
        "max_position_embeddings": int(max_sequence_length),
        "torch_dtype": dtype,
        "tie_word_embeddings": bool(
            getattr(backbone, "tie_word_embeddings", True)
        ),
        "eos_token_id": list(stop_token_ids),
    }
    start = getattr(tokenizer, "start_token_id", None)
    if start is not None:
        config["bos_token_id"] = int(start)
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        config["pad_token_id"] = int(pad)
    config.update(kv_layout(backbone))
    return config


def generation_config(sampler_name, sampler_config, stop_token_ids, tokenizer):
    """Builds `generation_config.json` (vLLM's default sampling parameters).

    Samplers without a vLLM equivalent (beam, contrastive, speculative) are
    reported with a warning and leave vLLM's defaults in place.
    """
    config = {"eos_token_id": list(stop_token_ids)}
    start = getattr(tokenizer, "start_token_id", None)
    if start is not None:
        config["bos_token_id"] = int(start)
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
