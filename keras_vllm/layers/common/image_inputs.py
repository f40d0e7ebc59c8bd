"""Which KerasHub backbones take images, and how their preprocessor feeds them.

A vision-language `CausalLM` turns each image into a fixed run of
placeholder tokens whose embeddings its vision encoder replaces. What that
run looks like (the prompt marker a user writes, the tokens around the
placeholders, how many placeholders, the image converter's pixels) is
family-specific; a family registers a function that reads it from its live
`CausalLM` (`@register_image_inputs` in `keras_vllm/layers/<family>.py`),
so export writes it into the artifact (`manifest.modalities.image`, format
1.9) without naming any family. The settings are plain JSON: a vLLM
processor rebuilds the same pixels and placeholder expansion from them
(`keras_vllm.hub.images`) with no Hugging Face processor files.
"""

_IMAGE_INPUTS = {}

# How image placeholder tokens attend to each other in the Keras model.
# "bidirectional_within_image": every placeholder of one image attends to
# every other placeholder of that image (Gemma 3), the rest causally; a
# layer may keep its placeholders causal (`paged_attend(image_spans=False)`).
IMAGE_ATTENTION = ("causal", "bidirectional_within_image")


def register_image_inputs(backbone_cls):
    """Function decorator: how a backbone class's `CausalLM` takes images.

    The decorated function takes a `keras_hub.models.CausalLM` and returns
    its image settings (the keys `keras_vllm.format.image_settings`
    validates), or None when this model takes no image (no vision encoder,
    or a preprocessor without an image converter).

    Args:
        backbone_cls: the KerasHub backbone class (exact class match).

    Example:

    ```python
    @register_image_inputs(Gemma3Backbone)
    def gemma3_image_inputs(causal_lm):
        ...
        return {"tokens_per_image": 256, ...}
    ```
    """

    def decorator(fn):
        _IMAGE_INPUTS[backbone_cls] = fn
        return fn

    return decorator


def image_settings(causal_lm):
    """The registered image settings of `causal_lm`, or None when its
    family registers none or the model takes no image."""
    fn = _IMAGE_INPUTS.get(type(causal_lm.backbone))
    return None if fn is None else fn(causal_lm)


# How a family's backbone runs with images: registered per backbone class
# (`@register_image_model`), used by the served model class.
_IMAGE_MODELS = {}


def plain_number(value):
    """A converter's scale or offset as JSON: None, a float or a list of
    floats (families' image settings store them so)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return float(value)


def register_image_model(backbone_cls):
    """Class decorator: how a backbone class runs on image embeddings.

    The decorated class has three static methods, all on Keras tensors:
    `embed_images(backbone, **inputs)` (the processor's arrays, one row per
    image: `pixel_values` `[N, H, W, 3]`, or `[N, P, D]` patches with
    `pixel_position_ids` (`keras_vllm.hub.images.image_model_inputs`) ->
    `[N, tokens_per_image, hidden]`, the rows that replace the
    placeholders), `embed_tokens(backbone, token_ids)` (`[B, T]` ->
    `[B, T, hidden]`, as the backbone embeds text) and
    `decode(backbone, embeddings, padding_mask, vision_mask, token_ids=,
    image_mask=)` (the decoder layers and final norm over merged
    embeddings: `[B, T, hidden]`; `token_ids` `[B, T]` and `image_mask`
    `bool[B, T]` (the image placeholders) for layers that also take
    per-token inputs of their own).
    A class attribute `generate_is_exact = False` says that KerasHub's
    cached `generate()` on image prompts is not the model's forward pass
    (what training and keras-vllm run): golden image outputs are then
    greedy decoding by the forward pass (`hub.golden_images`).

    Args:
        backbone_cls: the KerasHub backbone class (exact class match).
    """

    def decorator(cls):
        _IMAGE_MODELS[backbone_cls] = cls
        return cls

    return decorator


def image_model(backbone_cls):
    """The class registered for `backbone_cls`, or None."""
    return _IMAGE_MODELS.get(backbone_cls)


def merge_image_embeddings(token_embeddings, image_embeddings, is_placeholder):
    """Token embeddings with the placeholders' rows replaced, in order.

    Args:
        token_embeddings: `[T, hidden]` embeddings of a flat token batch.
        image_embeddings: `[M, hidden]` image rows, one per placeholder, in
            the order the placeholders appear.
        is_placeholder: `bool[T]`.
    """
    import jax.numpy as jnp

    if image_embeddings.shape[0] == 0:
        return token_embeddings
    index = jnp.cumsum(is_placeholder.astype(jnp.int32)) - 1
    index = jnp.clip(index, 0, image_embeddings.shape[0] - 1)
    rows = jnp.take(image_embeddings, index, axis=0).astype(
        token_embeddings.dtype
    )
    return jnp.where(is_placeholder[:, None], rows, token_embeddings)


def image_span_limits(is_placeholder, positions, sequence_ids):
    """Each token's last visible key position when every contiguous run of
    placeholders of one sequence attends to the whole run
    ("bidirectional_within_image"): a placeholder's is its run's last
    position, any other token's its own position (causal). The result is
    the kernel's `attend_until` (`keras_vllm.kernels.ragged_paged_attention`).

    Args:
        is_placeholder: `bool[T]` of a flat token batch.
        positions: `int32[T]` positions of the tokens in their sequences.
        sequence_ids: `int32[T]`: which sequence each token belongs to
            (tokens of one sequence are contiguous and in order).
    """
    import jax
    import jax.numpy as jnp

    mask = is_placeholder.astype(bool)
    previous = jnp.concatenate([jnp.zeros((1,), bool), mask[:-1]])
    same_sequence = jnp.concatenate(
        [jnp.zeros((1,), bool), sequence_ids[1:] == sequence_ids[:-1]]
    )
    starts = mask & ~(previous & same_sequence)
    run = jnp.cumsum(starts.astype(jnp.int32))
    count = mask.shape[0] + 1
    last = jax.ops.segment_max(
        jnp.where(mask, positions, -1), run, num_segments=count
    )
    return jnp.where(mask, last[run], positions).astype(jnp.int32)


def chat_content_jinja(marker):
    """A chat template's Jinja that sets `state.text` to message `m`'s text.

    String content is trimmed; content given as parts (OpenAI chat, which
    vLLM passes to a template that loops over them) is each image part as
    `marker`, where it stands (the place the family's preprocessor expands
    it), and each text part trimmed. The template declares
    `state = namespace(text='')` and loops `for m in messages`.

    Args:
        marker: the image marker a prompt holds (`"<start_of_image>"`).

    Example:

    ```python
    TEMPLATE = (
        "{% set state = namespace(text='') %}{% for m in messages %}"
        + chat_content_jinja("<start_of_image>")
        + "{{ state.text }}\\n{% endfor %}"
    )
    ```
    """
    return (
        "{% if m['content'] is string %}"
        "{% set state.text = m['content'] | trim %}"
        "{% else %}{% set state.text = '' %}"
        "{% for part in m['content'] %}"
        "{% if part['type'] == 'image' %}"
        f"{{% set state.text = state.text ~ '{marker}' %}}"
        "{% elif part['type'] == 'text' %}"
        "{% set state.text = state.text ~ (part['text'] | trim) %}"
        "{% endif %}{% endfor %}{% endif %}"
    )
