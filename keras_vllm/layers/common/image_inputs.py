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
# every other placeholder of that image (Gemma 3), the rest causally.
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
