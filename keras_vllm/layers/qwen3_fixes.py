"""The fix keras-hub 0.32's Qwen3 layers need.

`Qwen3TransformerDecoder` builds its `Qwen3Attention` without passing its
`layer_norm_epsilon`, so the attention's query and key RMS norms use the
attention's default, 1e-5, whatever the model's epsilon (every Qwen3
checkpoint has `rms_norm_eps` 1e-6; transformers uses it in those norms
too; keras-hub's Qwen3-MoE passes it). Measured on a tiny checkpoint
converted from transformers: logprobs up to 2.2e-4 from transformers'
(position 0, where RoPE and the norms' scale cancel, exact; 6e-7 with the
fix).

The replacement `build` gives those two norms the decoder's epsilon, so a
Qwen3 model is the one its config describes: converted from Hugging Face
or built from a keras-hub preset alike (their `generate()` and served
output move together, by about 1e-6 relative on published sizes, whose
query and key activations are far above 1e-5). Installed (through
`keras_vllm.patching`) as soon as keras-hub imports `qwen3_decoder`
(`keras_vllm.export.keras_hub_hooks`), before any model is built.
"""

import functools

from keras_vllm import patching

# The keras-hub module whose class this fix applies to.
KERAS_HUB_MODULE = "keras_hub.src.models.qwen3.qwen3_decoder"


def _norms_with_model_epsilon(original):

    @functools.wraps(original)
    def build(self, decoder_sequence_shape):
        original(self, decoder_sequence_shape)
        attention = self._self_attention_layer
        attention.layer_norm_epsilon = self.layer_norm_epsilon
        for norm in (
            attention._query_dense_layer_norm,
            attention._key_dense_layer_norm,
        ):
            norm.epsilon = self.layer_norm_epsilon

    return build


def install(module):
    """Fixes keras-hub's `Qwen3TransformerDecoder` of `module` (once).

    Args:
        module: the imported `keras_hub.src.models.qwen3.qwen3_decoder`.
    """
    patching.replace(
        module.Qwen3TransformerDecoder, "build", _norms_with_model_epsilon
    )
