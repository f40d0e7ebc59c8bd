"""Quantized copies of the session's fine-tuned tiny models.

Each (family, mode) is quantized once per session from a copy of the
family's fine-tuned model (`trained_models.trained`), which stays float for
the other modules.
"""

from helpers.trained_models import trained_copy
from keras_vllm import testing

# Keras 3.15's modes keras-vllm stores, loads and serves.
MODES = ("int8", "int4", "gptq")

_MODELS = {}


def _calibrate(causal_lm, mode):
    from keras import quantizers

    # `Model.quantize` visits every leaf layer, the preprocessor's tokenizer
    # too, and refuses an unbuilt one (keras-hub tokenizers have no build
    # step; presets load them unbuilt as well).
    causal_lm.preprocessor.tokenizer.built = True
    config = quantizers.GPTQConfig(
        dataset=list(testing.prompts()),
        tokenizer=causal_lm.preprocessor.tokenizer,
        weight_bits=4,
        group_size=16,
        num_samples=4,
        sequence_length=16,
    )
    causal_lm.quantize(mode, config=config)


def _servable(backbone):
    """Keras `quantize` filter: every layer but those whose kernels their
    parent reads raw (Gemma 4's dense FFN: KerasHub's decoder block
    multiplies by `.kernel`, so quantized they are wrong in Keras too, and
    export refuses them by name). The filter a Gemma 4 user passes."""
    from keras_vllm.layers import swap

    raw = swap.raw_kernel_layers(backbone)
    return lambda layer: layer.path not in raw


def quantized(family, mode):
    """`family`'s fine-tuned model quantized in `mode`, once per session.

    Tests must not change the returned model; export or call it.
    """
    key = (family, mode)
    if key not in _MODELS:
        copy = trained_copy(family)
        if mode == "gptq":
            _calibrate(copy, mode)
        else:
            copy.backbone.quantize(mode, filters=_servable(copy.backbone))
        assert any(
            getattr(layer, "quantization_mode", None) == mode
            for layer in copy.backbone._flatten_layers()
        ), f"no layer of {family} was quantized to {mode}"
        _MODELS[key] = copy
    return _MODELS[key]
