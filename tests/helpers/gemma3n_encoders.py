"""Tiny Gemma 3n models with their vision and audio encoders, built from the
text fixture.

Every KerasHub 0.32 Gemma 3n preset carries a MobileNetV5 vision encoder
and a conformer audio encoder, each with an embedder for its soft tokens
and its own vocabulary of "hard" tokens placed after the text vocabulary
(`vision_vocab_offset`, `audio_vocab_offset`). `with_encoders` adds tiny
random ones to a (trained) tiny text model, keeping its decoder weights.
Their vocabularies follow the tokenizer's: no text id reaches them.
"""

from helpers import vision_backbones

# Ids past the tokenizer's vocabulary for each encoder's hard tokens.
ENCODER_VOCABULARY = 8


def with_encoders(text_lm, seed=0):
    """`text_lm` (a Gemma 3n `CausalLM`) with a tiny vision and a tiny
    audio encoder added, its decoder variables copied over.

    The encoders' weights are random, seeded: every process builds the
    same model whatever ran before it.
    """
    import keras
    import keras_hub
    from keras_hub.src.models.gemma3n.gemma3n_audio_encoder import (
        Gemma3nAudioEncoder,
    )
    from keras_hub.src.models.mobilenetv5.mobilenetv5_backbone import (
        MobileNetV5Backbone,
    )
    from keras_hub.src.models.mobilenetv5.mobilenetv5_builder import (
        convert_arch_def_to_stackwise,
    )

    keras.utils.set_random_seed(seed)
    tokenizer = text_lm.preprocessor.tokenizer
    config = text_lm.backbone.get_config()
    vocab = config["text_vocab_size"]
    vision = MobileNetV5Backbone(
        **convert_arch_def_to_stackwise([["er_r1_k3_s1_e1_c16"]]),
        num_features=16, image_shape=(32, 32, 3), use_msfa=False,
    )
    audio = Gemma3nAudioEncoder(
        hidden_size=8, input_feat_size=16, sscp_conv_channel_size=[4, 8],
        sscp_conv_kernel_size=[(3, 3), (3, 3)],
        sscp_conv_stride_size=[(2, 2), (2, 2)], sscp_conv_group_norm_eps=1e-5,
        num_hidden_layers=1, rms_norm_eps=1e-6, gradient_clipping=1.0,
        residual_weight=0.5, num_attention_heads=1, attention_chunk_size=4,
        num_attention_context_right=5, num_attention_context_left=5,
        attention_logit_cap=50.0, conv_kernel_size=5, reduction_factor=1,
    )
    config.update(
        vision_encoder_config=vision.get_config(),
        vision_hidden_size=16,
        vision_vocab_size=ENCODER_VOCABULARY,
        vision_vocab_offset=vocab,
        vision_soft_tokens_per_image=4,
        image_token_id=tokenizer.token_to_id("<image_soft_token>"),
        audio_encoder_config=audio.get_config(),
        audio_hidden_size=8,
        audio_vocab_size=ENCODER_VOCABULARY,
        audio_vocab_offset=vocab + ENCODER_VOCABULARY,
        audio_soft_tokens_per_image=4,
        audio_token_id=tokenizer.token_to_id("<audio_soft_token>"),
    )
    backbone = keras_hub.models.Gemma3nBackbone(**config)
    vision_backbones.copy_text_weights(text_lm.backbone, backbone)
    causal_lm = keras_hub.models.Gemma3nCausalLM(
        backbone=backbone, preprocessor=text_lm.preprocessor
    )
    causal_lm.compile(sampler="greedy")
    return causal_lm


class ForwardWithoutEncoders:
    """The encoder model's own forward pass on a text prompt: no image, no
    audio clip (a stand-in for a `CausalLM` in the logprob checks)."""

    def __init__(self, causal_lm):
        self.causal_lm = causal_lm
        self.preprocessor = causal_lm.preprocessor

    def __call__(self, inputs):
        import numpy as np

        rows = np.shape(inputs["token_ids"])[0]
        backbone = self.causal_lm.backbone
        shape = tuple(backbone.vision_encoder.image_shape)
        features = backbone.audio_encoder.input_feat_size
        return self.causal_lm(
            {
                **inputs,
                "images": np.zeros((rows, 0) + shape, "float32"),
                "vision_indices": np.zeros((rows, 0), "int32"),
                "vision_mask": np.zeros_like(inputs["token_ids"], "bool"),
                "input_features": np.zeros((rows, 0, 0, features), "float32"),
                "input_features_mask": np.zeros((rows, 0, 0), "bool"),
                "audio_indices": np.zeros((rows, 0), "int32"),
                "audio_mask": np.zeros_like(inputs["token_ids"], "bool"),
            }
        )
