"""The registry of paged (vLLM) subclasses: a leaf every family imports.

Each family module in `keras_vllm/layers/` subclasses a KerasHub layer and
registers it here with `@register_paged`; `keras_vllm.layers.families`
lists the family modules, and `keras_vllm.layers.swap` (what generic code
calls) imports that list before asking this registry. Nothing here imports
a family, so the arrows point one way: swap -> families -> each family ->
registry.

Three kinds of layers are registered:

- attention layers (`PagedAttention` subclasses): they own one KV cache each
  and attend through `PagedAttention.paged_attend`;
- position-dependent layers (e.g. a learned position embedding): they read
  vLLM's token positions instead of assuming `0..T-1`;
- mixture-of-experts blocks (`routed_experts.RoutedExperts` subclasses):
  they compute each token's top-k experts only.

A family may also register, for a backbone class that can carry encoders
(a vision tower), how to build its text decoder alone
(`@register_text_decoder`): such a model is exported whole and served on
text prompts through that decoder. And a family keras-vllm does not serve
yet may say what its decoder needs that keras-vllm lacks
(`@register_missing_capabilities`), so its refusal names those pieces.
"""

_PAGED_CLASSES = {}
_TEXT_DECODERS = {}
_RAW_KERNEL_READERS = {}
_MISSING_CAPABILITIES = {}
_ENCODER_TOKEN_IDS = {}


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


_CHAT_TEMPLATES = {}


def register_chat_template(tokenizer_class_name, template, tokens=()):
    """Registers the chat format of a family's instruction-tuned presets.

    KerasHub presets carry no chat template, but each family's
    instruction-tuned presets were trained on one format, written with the
    special tokens its tokenizer declares. An export of a model from such a
    preset stores this template (`keras_vllm.export.chat_templates`).

    Args:
        tokenizer_class_name: the KerasHub tokenizer class's name (a
            subclass matches too).
        template: the Jinja chat template (HF's variables: `messages`,
            `add_generation_prompt`, `bos_token`, `eos_token`).
        tokens: special tokens the template writes that the vocabulary must
            hold as single tokens (an older vocabulary of the family may
            lack them: then no template is stored).
    """
    _CHAT_TEMPLATES[tokenizer_class_name] = (template, tuple(tokens))


def chat_template(tokenizer):
    """The registered chat template for `tokenizer`, or None.

    Looks up the tokenizer's class and its bases by name; None when none
    is registered or the vocabulary lacks one of the template's tokens.
    """
    for cls in type(tokenizer).__mro__:
        if cls.__name__ in _CHAT_TEMPLATES:
            template, tokens = _CHAT_TEMPLATES[cls.__name__]
            for token in tokens:
                try:
                    if tokenizer.token_to_id(token) is None:
                        return None
                except (KeyError, ValueError):
                    return None
            return template
    return None


def register_text_decoder(backbone_cls):
    """Function decorator: how a backbone with encoders serves text alone.

    The decorated function takes the backbone's `get_config()` and returns
    the config of the same class without its encoders (same variable paths
    for every decoder weight), or None when the config has none.

    Args:
        backbone_cls: the KerasHub backbone class (exact class match).

    Example:

    ```python
    @register_text_decoder(Gemma3Backbone)
    def gemma3_text_decoder(config):
        return dict(config, vision_encoder=None)
    ```
    """

    def decorator(fn):
        _TEXT_DECODERS[backbone_cls] = fn
        return fn

    return decorator


def text_decoders():
    """`{backbone_class: text decoder config function}` registered so far."""
    return dict(_TEXT_DECODERS)


def register_raw_kernel_readers(parent_cls, layer_names):
    """Declares sublayers whose kernels a KerasHub layer multiplies by
    directly (`ops.matmul(x, self.ffw.kernel)`) instead of calling them.

    Keras computes a quantized layer in its own `call`; read this way, a
    quantized kernel is used as raw integers and the model's output is
    wrong in Keras too. Export refuses such layers quantized, by name.

    Args:
        parent_cls: the KerasHub layer class (instances of subclasses too).
        layer_names: attribute names of its sublayers read this way.

    Example:

    ```python
    register_raw_kernel_readers(Gemma4TextDecoderBlock, ("ffw_linear",))
    ```
    """
    _RAW_KERNEL_READERS[parent_cls] = tuple(layer_names)


def raw_kernel_readers():
    """`{parent class: sublayer attribute names}` registered so far."""
    return dict(_RAW_KERNEL_READERS)


def register_missing_capabilities(backbone_cls):
    """Function decorator: what a backbone's decoder needs that keras-vllm
    does not have, for its export refusal.

    The decorated function takes the backbone and returns a list of short
    descriptions (read from the instance: sizes, counts), each a mechanism
    the served model would need.

    Args:
        backbone_cls: the KerasHub backbone class (exact class match).

    Example:

    ```python
    @register_missing_capabilities(RecurrentBackbone)
    def recurrent_missing(backbone):
        return [f"recurrent state caches ({backbone.num_layers} layers)"]
    ```
    """

    def decorator(fn):
        _MISSING_CAPABILITIES[backbone_cls] = fn
        return fn

    return decorator


def missing_capabilities(backbone):
    """What the backbone's family registered as missing (None when it
    registered nothing)."""
    fn = _MISSING_CAPABILITIES.get(type(backbone))
    return None if fn is None else list(fn(backbone))


def register_encoder_token_ids(backbone_cls):
    """Function decorator: the token ids a backbone's encoders embed.

    A model exported with encoders it does not serve (its text decoder is
    served) may embed some token ids through an encoder's own embedder;
    the served decoder embeds them from its text table instead, so a prompt
    holding one would be served differently, and is refused. The decorated
    function takes the backbone's `get_config()` and returns half-open
    `(start, stop)` id ranges (empty when the config has no encoders).

    Args:
        backbone_cls: the KerasHub backbone class (exact class match).

    Example:

    ```python
    @register_encoder_token_ids(Gemma3nBackbone)
    def gemma3n_encoder_ids(config):
        offset = config["vision_vocab_offset"]
        return [(offset, offset + config["vision_vocab_size"])]
    ```
    """

    def decorator(fn):
        _ENCODER_TOKEN_IDS[backbone_cls] = fn
        return fn

    return decorator


def encoder_token_ids(backbone_cls, config):
    """The `(start, stop)` id ranges the family registered for a backbone
    of `backbone_cls` with this config (none when it registered nothing)."""
    fn = _ENCODER_TOKEN_IDS.get(backbone_cls)
    return [] if fn is None else [tuple(r) for r in fn(config)]
