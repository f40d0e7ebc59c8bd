"""The KV cache layout an exported backbone needs, from the paged layers.

`config.json` tells vLLM how many KV caches to allocate and their shape;
those numbers come from each attention layer's paged subclass (the
registry), never from a family's config keys.

vLLM's TPU runner (tpu-inference 0.32, its JAX-model path) sizes one cache
per layer from `layer_types` and, per kind of layer, the fields it reads:
`head_dim` / `num_key_value_heads` for sliding-window layers and for all
layers of a uniform model; `global_head_dim`, and with
`attention_k_eq_v` `num_global_key_value_heads`, for full-attention layers
(format 1.7). The last `num_kv_shared_layers` layers get no cache: each
reads the last earlier cache of its kind. So a model may mix two shapes,
one per kind of layer; other mixes are refused.

Layers with a recurrent state (format 1.10) count among the layers
(`num_hidden_layers`, vLLM's `layer.{i}`) and are listed by
`recurrent_state_layers`, with their one state layout
(`recurrent_state_shapes`, `recurrent_state_dtypes`): keras-vllm's runner
patch gives them vLLM state slots instead of KV caches
(`keras_vllm.serve.worker.state_caches`).
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
    return layout_fields(specs)


def state_fields(specs):
    """The 1.10 `config.json` fields of the layers with a recurrent state
    among `specs` (one spec per layer with per-sequence memory), or {}.

    Raises:
        UnsupportedModelError: state layers of different layouts (vLLM's
            hybrid allocator pads every page to one state size), or a model
            with state layers only.
    """
    layers = [
        i for i, spec in enumerate(specs) if getattr(spec, "recurrent", False)
    ]
    if not layers:
        return {}
    first = specs[layers[0]]
    if any(specs[i] != first for i in layers):
        raise UnsupportedModelError(
            "Layers with a recurrent state of different shapes or dtypes are "
            "not supported: vLLM's hybrid cache pads every layer's page to "
            "one state layout."
        )
    if len(layers) == len(specs):
        raise UnsupportedModelError(
            "A model whose every layer keeps a recurrent state (no attention "
            "layer) is not supported: vLLM's hybrid cache sizes its pages "
            "from the attention layers."
        )
    return {
        "recurrent_state_layers": layers,
        "recurrent_state_shapes": [list(shape) for shape in first.shapes],
        "recurrent_state_dtypes": [str(dtype) for dtype in first.dtypes],
    }


def _shape(spec):
    return spec.num_query_heads, spec.num_kv_heads, spec.head_dim


def layout_fields(specs):
    """The `config.json` fields for one `KVCacheSpec` per attention layer.

    Raises:
        UnsupportedModelError: shapes vLLM's per-kind cache sizing cannot
            express, or KV sharing it cannot route.
    """
    from keras_vllm.layers.common.base import cache_sources

    state = state_fields(specs)
    layers = len(specs)
    specs = [s for s in specs if not getattr(s, "recurrent", False)]
    sources = cache_sources(specs)
    windows = [spec.sliding_window for spec in specs]
    sliding = [s for s in specs if s.sliding_window is not None]
    full = [s for s in specs if s.sliding_window is None]
    base = sliding[0] if sliding else specs[0]
    fields = {
        "num_hidden_layers": layers,
        "num_attention_heads": base.num_query_heads,
        "num_key_value_heads": base.num_kv_heads,
        "head_dim": base.head_dim,
    }
    for group in (sliding, full):
        if any(_shape(s) != _shape(group[0]) for s in group):
            raise UnsupportedModelError(
                "Attention layers of one kind (sliding window or full) with "
                "different head counts or sizes are not supported by vLLM's "
                "per-layer KV cache sizing."
            )
    if full and _shape(full[0]) != _shape(base):
        glob = full[0]
        if glob.num_query_heads != base.num_query_heads:
            raise UnsupportedModelError(
                "Attention layers with different head counts or sizes are "
                "supported only as sliding-window layers of one shape and "
                "full-attention layers of another, with equal query heads."
            )
        if glob.head_dim != base.head_dim:
            fields["global_head_dim"] = glob.head_dim
        if glob.num_kv_heads != base.num_kv_heads:
            # What makes vLLM's runner read the global KV head count.
            fields["attention_k_eq_v"] = True
            fields["num_global_key_value_heads"] = glob.num_kv_heads
    shared = sum(1 for i, source in enumerate(sources) if source != i)
    if sliding:
        fields["layer_types"] = [
            "sliding_attention" if w is not None else "full_attention"
            for w in windows
        ]
        fields["sliding_window"] = max(w for w in windows if w is not None)
    elif shared:
        raise UnsupportedModelError(
            "KV cache sharing without sliding-window layers is not "
            "supported: vLLM routes shared caches by layer_types."
        )
    if shared:
        fields["num_kv_shared_layers"] = shared
    if state and (sliding or shared):
        raise UnsupportedModelError(
            "Layers with a recurrent state together with sliding-window or "
            "KV-sharing attention layers are not supported: vLLM numbers "
            "their caches by layer_types."
        )
    fields.update(state)
    return fields
