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


# GPTQ's block size: 16 columns (the group size) instead of Keras' 128.
# Keras runs GPTQ's column loop eagerly, and every slice width the loop meets
# is one more XLA compilation: with 128-column blocks each of a tiny layer's
# 64 or 128 columns has its own width (measured: 170 s to calibrate the tiny
# Llama on the shared 2-core host), with 16-column blocks the widths repeat
# from block to block. Blocks only batch GPTQ's error updates (lazy batch
# updates), so the calibration is the same algorithm: every column is still
# quantized with the Hessian-weighted error of the ones before it.
GPTQ_BLOCK_SIZE = 16


def _calibrate(causal_lm, mode):
    from unittest import mock

    from keras import quantizers
    from keras.src.quantizers import gptq

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
    quantize_layer = gptq.GPTQ.quantize_and_correct_layer

    def in_small_blocks(self, blocksize=GPTQ_BLOCK_SIZE):
        return quantize_layer(self, blocksize=blocksize)

    # Only for this call: `GPTQConfig` has no block size, and Keras'
    # layer-wise loop calls the method with its default.
    with mock.patch.object(
        gptq.GPTQ, "quantize_and_correct_layer", in_small_blocks
    ):
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
