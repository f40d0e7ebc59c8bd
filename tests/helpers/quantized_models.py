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
            copy.backbone.quantize(mode)
        _MODELS[key] = copy
    return _MODELS[key]
