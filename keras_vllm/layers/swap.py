"""Finding a backbone's attention layers and swapping in paged subclasses.

This is what generic code (the exporter, the loader, the model class) asks;
it never names a model family. Importing it imports every family module
(`keras_vllm.layers.families`), so the registry is complete.

Swapping re-classes each layer instance in place (`layer.__class__ =
paged_cls`): the paged subclass inherits the parent's sublayers and
variables, so no weight is copied or converted.
"""

import inspect

import keras

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers import families  # noqa: F401  (registers them all)
from keras_vllm.layers.common import registry


def registered_classes():
    """Returns `{keras_hub_class: paged_subclass}` for every family."""
    return registry.registered()


def paged_class_for(layer_or_cls):
    """Returns the paged subclass for a layer (exact class match) or None."""
    cls = layer_or_cls if isinstance(layer_or_cls, type) else type(layer_or_cls)
    if getattr(cls, "_is_paged_layer", False):
        return cls
    return registry.registered().get(cls)


def _call_parameters(layer):
    try:
        return inspect.signature(type(layer).call).parameters
    except (TypeError, ValueError):
        return {}


def _takes_cache(layer):
    return any("cache" in name for name in _call_parameters(layer))


def _registered_attention(layer):
    """Whether the registry serves this layer as a KV-cache owner."""
    paged_cls = registry.registered().get(type(layer))
    return getattr(paged_cls, "_owns_kv_cache", False)


def _passes_cache(layer):
    # A registered attention class counts whatever its signature: some take
    # their cache through `**kwargs`, which no parameter name shows.
    return _takes_cache(layer) or _registered_attention(layer)


def layers_in_order(backbone):
    """Every sublayer of `backbone` once, depth first, each layer's children
    in the order it holds them.

    Keras' `_flatten_layers` visits the children of a nested layer in
    reverse: a decoder nested in the backbone (Gemma 3n's `language_model`)
    would list its last block first.
    """
    found, seen = [], set()

    def visit(layer):
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if id(child) not in seen:
                seen.add(id(child))
                found.append(child)
                visit(child)

    visit(backbone)
    return found


def find_attention_layers(backbone):
    """Finds the layers that hold attention state, in the backbone's order.

    A layer counts as attention when it is a Keras `MultiHeadAttention`,
    when its class is registered as paged attention (whatever its `call`
    signature: a cache passed through `**kwargs` shows no parameter), or
    when its `call` takes a cache argument and none of its own sublayers
    passes one on (decoder blocks also pass a cache, but only down to
    attention). This structural rule needs no list of families, so a new
    family's attention is found (and refused if unsupported) without code
    changes.
    """
    found = []
    for layer in layers_in_order(backbone):
        if isinstance(layer, keras.layers.MultiHeadAttention):
            found.append(layer)
            continue
        if _registered_attention(layer):
            found.append(layer)
            continue
        if not _takes_cache(layer) or getattr(layer, "_is_paged_layer", False):
            if getattr(layer, "_owns_kv_cache", False):
                found.append(layer)
            continue
        children = layer._flatten_layers(include_self=False, recursive=True)
        if not any(_passes_cache(child) for child in children):
            found.append(layer)
    # A registered MultiHeadAttention subclass appears once only.
    unique = []
    for layer in found:
        if not any(layer is seen for seen in unique):
            unique.append(layer)
    return unique


def check_servable(backbone):
    """Raises `UnsupportedModelError` unless every attention layer of the
    backbone has a registered paged subclass (the conformance gate)."""
    missing = sorted(
        {
            f"{type(layer).__module__}.{type(layer).__qualname__}"
            for layer in find_attention_layers(backbone)
            if paged_class_for(layer) is None
        }
    )
    if missing:
        raise UnsupportedModelError(
            f"{type(backbone).__name__} uses attention layer class "
            f"{', '.join(missing)}, which has no paged subclass in keras-vllm, "
            "so it cannot be served on vLLM. Supported: "
            + ", ".join(sorted(c.__name__ for c in registered_classes()))
            + ". Add a subclass in keras_vllm/layers/ to support it."
        )


def memory_spec(paged_cls, layer):
    """What one layer keeps per sequence: its `StateSpec` for a layer with
    a recurrent state, else its `KVCacheSpec`.

    Args:
        paged_cls: the layer's paged subclass.
        layer: the layer (swapped or not).
    """
    if getattr(paged_cls, "_has_recurrent_state", False):
        return paged_cls.state_spec(layer)
    return paged_cls.kv_cache_spec(layer)


def kv_cache_specs(backbone):
    """Returns one spec per layer with per-sequence memory, in backbone
    order: a `KVCacheSpec` per attention layer, a `StateSpec` per layer
    with a recurrent state (`memory_spec`).

    Raises:
        UnsupportedModelError: an attention layer has no paged subclass.
    """
    check_servable(backbone)
    return [
        memory_spec(paged_class_for(layer), layer)
        for layer in find_attention_layers(backbone)
    ]


def swap_in_paged_layers(backbone):
    """Re-classes every registered layer of `backbone` as its paged subclass.

    Attention layers get `kv_layer_index` in backbone order (vLLM's
    `layer.{i}`; `ServingContext` maps it to a KV cache).

    Returns:
        The list of paged attention layers, in backbone order.

    Raises:
        UnsupportedModelError: if an attention layer has no paged subclass.
    """
    check_servable(backbone)
    attention = find_attention_layers(backbone)
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        paged_cls = paged_class_for(layer)
        if paged_cls is not None and type(layer) is not paged_cls:
            layer.__class__ = paged_cls
    # A paged layer may read settings from the layer that holds it (an
    # expert bank, its block's router's top-k).
    for parent in backbone._flatten_layers(include_self=True, recursive=True):
        for child in parent._flatten_layers(include_self=False, recursive=False):
            bind = getattr(type(child), "bind_parent", None)
            if bind is not None and getattr(child, "_is_paged_layer", False):
                bind(child, parent)
    for index, layer in enumerate(attention):
        layer.kv_layer_index = index
    return attention


def text_decoder_config(backbone_or_config, backbone_cls=None):
    """The config of a backbone's text decoder alone, when it has encoders.

    Args:
        backbone_or_config: a backbone, or a backbone config dict (then
            `backbone_cls` is its class).
        backbone_cls: the class of a config dict.

    Returns:
        The text-only config from the family's registered function
        (`registry.register_text_decoder`), or None when the family
        registers none or the config carries no encoder.
    """
    if isinstance(backbone_or_config, dict):
        config, cls = backbone_or_config, backbone_cls
    else:
        config, cls = backbone_or_config.get_config(), type(backbone_or_config)
    fn = registry.text_decoders().get(cls)
    return None if fn is None else fn(dict(config))


def raw_kernel_layers(backbone):
    """`{sublayer path: (parent class name, attribute)}` of the backbone's
    layers whose kernels their parent reads directly
    (`registry.register_raw_kernel_readers`)."""
    readers = registry.raw_kernel_readers()
    found = {}
    for layer in backbone._flatten_layers(include_self=False, recursive=True):
        for cls, names in readers.items():
            if not isinstance(layer, cls):
                continue
            for name in names:
                sublayer = getattr(layer, name, None)
                if sublayer is not None:
                    found[sublayer.path] = (type(layer).__name__, name)
    return found


def supported_families_table():
    """The README's table of served layers, generated from the registry.

    Returns:
        A Markdown table: one row per family module of `keras_vllm/layers/`
        with the KerasHub classes it serves.
    """
    rows = {}
    for base, paged in registered_classes().items():
        family = paged.__module__.rsplit(".", 1)[-1]
        rows.setdefault(family, []).append(f"`{base.__name__}`")
    lines = [
        "| module `keras_vllm/layers/` | KerasHub layers served |",
        "|---|---|",
    ]
    for family in sorted(rows):
        lines.append(f"| `{family}.py` | {', '.join(sorted(rows[family]))} |")
    return "\n".join(lines)


def prefix_cacheable(backbone):
    """Whether vLLM may serve `backbone` with prefix caching: every paged
    layer's `prefix_cacheable()` (called on the KerasHub layers, swapped or
    not)."""
    return all(
        paged_class_for(layer).prefix_cacheable(layer)
        for layer in find_attention_layers(backbone)
        if paged_class_for(layer) is not None
    )


def needs_prompt_lengths(backbone):
    """Whether a paged layer of `backbone` reads each token's prompt length
    (`PagedAttention.needs_prompt_lengths`)."""
    for layer in find_attention_layers(backbone):
        # Recurrent-state layers (Qwen 3.5's Gated DeltaNet) are not
        # `PagedAttention`s: they read no positions.
        reads = getattr(paged_class_for(layer), "needs_prompt_lengths", None)
        if reads is not None and reads(layer):
            return True
    return False


def golden_reference(backbone):
    """How the served output of `backbone` is predicted in Keras.

    Returns:
        `"generate"` (KerasHub's cached `generate()`), or `"forward_pass"`
        when a family's paged subclass declares that its KerasHub cached
        decoding is not the reference (greedy by full forward passes is).
    """
    references = {
        paged_class_for(layer).golden_reference
        for layer in find_attention_layers(backbone)
        if paged_class_for(layer) is not None
    }
    return "forward_pass" if "forward_pass" in references else "generate"


def missing_capabilities(backbone):
    """What the backbone's family says its decoder needs that keras-vllm
    lacks (`registry.register_missing_capabilities`), or None."""
    return registry.missing_capabilities(backbone)
