"""The KV cache layout an exported backbone needs, from the paged layers.

`config.json` tells vLLM how many KV caches to allocate and their shape;
those numbers come from each attention layer's paged subclass (the
registry), never from a family's config keys.
"""

from keras_vllm.errors import UnsupportedModelError


def kv_layout(backbone):
    """Per-layer KV cache facts from the registry of paged layers.

    Returns:
        A dict of `config.json` fields, or raises `UnsupportedModelError`.
    """
    from keras_vllm.layers.swap import kv_cache_specs

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
