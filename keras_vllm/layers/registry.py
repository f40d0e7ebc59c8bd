"""The registry of paged (vLLM) subclasses: a leaf every family imports.

Each family module in `keras_vllm/layers/` subclasses a KerasHub layer and
registers it here with `@register_paged`; `keras_vllm.layers.families`
lists the family modules, and `keras_vllm.layers.swap` (what generic code
calls) imports that list before asking this registry. Nothing here imports
a family, so the arrows point one way: swap -> families -> each family ->
registry.

Two kinds of layers are registered:

- attention layers (`PagedAttention` subclasses): they own one KV cache each
  and attend through `PagedAttention.paged_attend`;
- position-dependent layers (e.g. a learned position embedding): they read
  vLLM's token positions instead of assuming `0..T-1`;
- mixture-of-experts blocks (`routed_experts.RoutedExperts` subclasses):
  they compute each token's top-k experts only.
"""

_PAGED_CLASSES = {}


def register_paged(base_cls):
    """Class decorator: registers a paged subclass for a KerasHub class.

    Args:
        base_cls: the KerasHub layer class the decorated class replaces. It
            must be a direct base of the decorated class.

    Example:

    ```python
    @register_paged(keras_hub.src.models.llama.llama_attention.LlamaAttention)
    class PagedLlamaAttention(LlamaAttention, RotaryPagedAttention):
        ...
    ```
    """

    def decorator(paged_cls):
        if not issubclass(paged_cls, base_cls):
            raise TypeError(
                f"{paged_cls.__name__} must subclass {base_cls.__name__}."
            )
        _PAGED_CLASSES[base_cls] = paged_cls
        return paged_cls

    return decorator


def registered():
    """`{keras_hub_class: paged_subclass}` of the modules imported so far."""
    return dict(_PAGED_CLASSES)
