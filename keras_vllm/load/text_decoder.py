"""The text decoder of a backbone that also carries encoders (a vision tower).

An artifact of such a model stores the whole backbone (so Keras rebuilds the
model it was exported from, and a delta against its preset stays small) and
says in `manifest.modalities` which inputs its served model does not take.
vLLM feeds the backbone `token_ids` and `padding_mask` only, so the served
model is the same backbone class built from its family's text-only config
(`keras_vllm.layers.common.registry.register_text_decoder`), holding the very
arrays of the full backbone's decoder variables (no copy). On text prompts
it computes what the full model computes: with no image, its encoder adds
nothing to the sequence.
"""

from keras_vllm import format as fmt
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.swap import text_decoder_config
from keras_vllm.load import uninitialized


def served_backbone(backbone, manifest):
    """The backbone vLLM runs: `backbone` itself, or its text decoder when
    the artifact lists inputs its served model does not take.

    Raises:
        UnsupportedModelError: when no text decoder is registered for the
            backbone's class (the artifact was written by a keras-vllm that
            had one).
    """
    if not fmt.unserved_inputs(manifest):
        return backbone
    return text_backbone(backbone)


def text_backbone(backbone):
    """`backbone`'s text decoder alone: the same class built from its
    family's text-only config, holding the backbone's decoder arrays.

    Raises:
        UnsupportedModelError: when no text decoder is registered for the
            backbone's class, or the backbone has no encoder.
    """
    config = text_decoder_config(backbone)
    if config is None:
        raise UnsupportedModelError(
            f"The artifact serves the text decoder of its "
            f"{type(backbone).__name__}, but this keras-vllm registers no "
            "text decoder for that class. Use the keras-vllm version that "
            "exported it."
        )
    with uninitialized.values_deferred():
        decoder = type(backbone).from_config(config)
    values = _shared_values(backbone, decoder)
    uninitialized.assign_values(decoder, values)
    return decoder


def _shared_values(backbone, decoder):
    """`[(decoder variable, the backbone's value)]`, matched in order.

    The decoder's variables are the backbone's without the encoders', in
    the same order; paths are compared without Keras' per-process layer
    numbering, and shapes must agree.
    """
    source = weight_io.ordered_variables(backbone)
    values = []
    position = 0
    for variable in weight_io.ordered_variables(decoder):
        want = weight_io.canonical_path(variable.path)
        while position < len(source) and (
            weight_io.canonical_path(source[position].path) != want
            or tuple(source[position].shape) != tuple(variable.shape)
        ):
            position += 1
        if position == len(source):
            uninitialized.forget(decoder)
            raise UnsupportedModelError(
                f"The text decoder of {type(backbone).__name__} has a "
                f"variable '{variable.path}' the full backbone lacks; its "
                "family's registered text decoder config is wrong."
            )
        values.append((variable, source[position].value))
        position += 1
    return values
