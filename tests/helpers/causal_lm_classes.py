"""Every `CausalLM` class of keras-hub, with a tiny random model of each that
keras-vllm does not serve, built offline (no preprocessor: the refusals
come before one is read).

`OUTCOMES` maps each concrete class of keras-hub's `CausalLM` registry to
what `export_vllm()` does with it: `"served"` (a family of
`keras_vllm.testing.FAMILIES`) or a refusal, as a regex its
`UnsupportedModelError` must match. A class keras-hub adds that is not
listed fails `test_every_keras_hub_causal_lm_class_is_listed`.
"""

import inspect
import re

import keras_hub
from keras_hub.src.models.causal_lm import CausalLM

_TINY = dict(num_layers=2, hidden_dim=64, intermediate_dim=128)

_SEQ2SEQ = "encoder-decoder model .* encoder-decoder \\(cross-attention\\)"
_ATTENTION = "uses attention layer class .*{}.* no paged subclass"

OUTCOMES = {
    "BloomCausalLM": "served",
    "FalconCausalLM": "served",
    "GPT2CausalLM": "served",
    "GPTNeoXCausalLM": "served",
    "GptOssCausalLM": "served",
    "Gemma3CausalLM": "served",
    "Gemma3nCausalLM": "served",
    "Gemma4CausalLM": "served",
    "GemmaCausalLM": "served",
    "Llama3CausalLM": "served",
    "LlamaCausalLM": "served",
    "MistralCausalLM": "served",
    "MixtralCausalLM": "served",
    "OPTCausalLM": "served",
    "Phi3CausalLM": "served",
    "Qwen3CausalLM": "served",
    "Qwen3MoeCausalLM": "served",
    "QwenCausalLM": "served",
    "QwenMoeCausalLM": "served",
    "SmolLM3CausalLM": "served",
    "BLIP2CausalLM": "BLIP2Backbone has no hidden_dim / vocabulary_size.*"
    "Missing capability: inputs images",
    "PARSeqCausalLM": "PARSeqBackbone has no hidden_dim.*"
    "Missing capability: inputs images",
    "RWKV7CausalLM": "RWKV7Backbone has no hidden_dim.*recurrent state",
    "PaliGemmaCausalLM": "PaliGemmaBackbone takes inputs images, "
    "response_mask .*Missing capability: those inputs",
    "Gemma4AssistantCausalLM": "not a standalone text generator .* "
    "speculative decoding",
    "Qwen3_5CausalLM": "served",
    "Qwen3_5MoeCausalLM": "served",
    "BLIP2Seq2SeqLM": _SEQ2SEQ,
    "BartSeq2SeqLM": _SEQ2SEQ,
    "EdRecSeq2SeqLM": _SEQ2SEQ,
    "MoonshineAudioToText": _SEQ2SEQ,
    "T5Gemma2Seq2SeqLM": _SEQ2SEQ,
    "T5GemmaSeq2SeqLM": _SEQ2SEQ,
    "T5Seq2SeqLM": _SEQ2SEQ,
}


def keras_hub_causal_lm_classes():
    """The concrete `CausalLM` subclasses keras-hub exports, by name."""
    found = {}
    pending = list(CausalLM.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        public = getattr(keras_hub.models, cls.__name__, None) is cls
        if public and getattr(cls, "backbone_cls", None) is not None:
            found[cls.__name__] = cls
    return found


def _blip2(vocab):
    from keras_hub.src.models.blip2.blip2_custom_opt import BLIP2CustomOPT
    from keras_hub.src.models.blip2.blip2_qformer import BLIP2QFormer
    from keras_hub.src.models.blip2.blip2_vision_encoder import (
        BLIP2VisionEncoder,
    )

    vision = BLIP2VisionEncoder(
        image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32,
        intermediate_dim=64, use_patch_bias=True, use_class_token=True,
        use_mha_bias=True, use_mlp_bias=True, dropout_rate=0.0,
        layer_norm_epsilon=1e-6, initializer_range=0.02,
    )
    qformer = BLIP2QFormer(
        num_query_tokens=4, num_layers=1, num_heads=2, hidden_dim=32,
        intermediate_dim=64, vision_dim=32, cross_attention_frequency=1,
        dropout=0.0, layer_norm_epsilon=1e-6,
    )
    language = BLIP2CustomOPT(
        vocabulary_size=vocab, num_layers=1, num_heads=2, hidden_dim=32,
        intermediate_dim=64, num_query_tokens=4, dropout=0.0,
        max_sequence_length=32, qformer_hidden_dim=32,
    )
    return keras_hub.models.BLIP2Backbone(
        vision_encoder=vision, qformer=qformer, language_model=language
    )


def _parseq(vocab):
    image_encoder = keras_hub.models.ViTBackbone(
        image_shape=(16, 32, 3), patch_size=8, num_layers=1, num_heads=2,
        hidden_dim=32, mlp_dim=64, use_class_token=False,
    )
    return keras_hub.models.PARSeqBackbone(
        image_encoder=image_encoder, vocabulary_size=vocab, max_label_length=8,
        decoder_hidden_dim=32, num_decoder_layers=1, num_decoder_heads=2,
        decoder_mlp_dim=64,
    )


def _gemma4_assistant(vocab):
    backbone = keras_hub.models.Gemma4Backbone(
        vocabulary_size=vocab, image_size=16, num_layers=2,
        num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
        intermediate_dim=64, head_dim=16, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window_size=16,
    )
    return keras_hub.models.Gemma4AssistantCausalLM(
        backbone=backbone, backbone_hidden_size=64, num_centroids=8,
        centroid_intermediate_top_k=2, use_ordered_embeddings=True,
    )


_BACKBONES = {
    "BLIP2CausalLM": _blip2,
    "PARSeqCausalLM": _parseq,
    "RWKV7CausalLM": lambda vocab: keras_hub.models.RWKV7Backbone(
        hidden_size=64, head_size=16, num_layers=2, vocabulary_size=vocab,
        intermediate_dim=128,
    ),
    "PaliGemmaCausalLM": lambda vocab: keras_hub.models.PaliGemmaBackbone(
        vocabulary_size=vocab, image_size=16, num_query_heads=4,
        num_key_value_heads=1, head_dim=16, vit_patch_size=8,
        vit_num_heads=2, vit_hidden_dim=32, vit_num_layers=1, **_TINY,
    ),
    # Served with head_dim 64 only (its attention sinks): this head_dim 16
    # model is refused, and exported for Keras-side use by
    # `test_allow_unservable_exports_for_keras_side_use`.
    "GptOssCausalLM": lambda vocab: keras_hub.models.GptOssBackbone(
        vocabulary_size=vocab, num_query_heads=4, num_key_value_heads=2,
        num_experts=4, top_k=2, sliding_window=16, head_dim=16, **_TINY,
    ),
    "Qwen3_5CausalLM": lambda vocab: keras_hub.models.Qwen3_5Backbone(
        vocabulary_size=vocab, num_layers=4, num_query_heads=4,
        num_key_value_heads=2, head_dim=16, hidden_dim=64,
        intermediate_dim=128, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16,
    ),
    "Qwen3_5MoeCausalLM": lambda vocab: keras_hub.models.Qwen3_5MoeBackbone(
        vocabulary_size=vocab, num_layers=4, num_query_heads=4,
        num_key_value_heads=2, head_dim=16, hidden_dim=64,
        moe_intermediate_dim=32, shared_expert_intermediate_size=64,
        num_experts=4, top_k=2, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16,
    ),
}


def matches(name, message):
    """Whether a refusal message is the one `OUTCOMES` expects."""
    return re.search(OUTCOMES[name], message, flags=re.DOTALL) is not None


def tiny_unserved(name, vocabulary_size=256):
    """A tiny random model of a class keras-vllm refuses (no preprocessor).

    Classes refused from their class alone (encoder-decoders) come without
    their constructor run: `export_vllm()` reads nothing of the instance
    before it refuses them.
    """
    cls = keras_hub_causal_lm_classes()[name]
    if name == "Gemma4AssistantCausalLM":
        return _gemma4_assistant(vocabulary_size)
    if name not in _BACKBONES:
        return cls.__new__(cls)
    backbone = _BACKBONES[name](vocabulary_size)
    params = inspect.signature(cls.__init__).parameters
    kwargs = {"backbone": backbone}
    if "preprocessor" in params:
        kwargs["preprocessor"] = None
    if name == "PARSeqCausalLM":
        # Its constructor reads the tokenizer's padding id (offline: the
        # tokenizer's vocabulary is built in).
        kwargs["preprocessor"] = keras_hub.models.PARSeqCausalLMPreprocessor(
            tokenizer=keras_hub.tokenizers.PARSeqTokenizer(max_label_length=8),
            sequence_length=8,
        )
    return cls(**kwargs)
