"""Gemma 3n (`Gemma3nCausalLM`): refused, with what serving it would need.

keras-vllm does not serve Gemma 3n. Its `Gemma3nBackbone` only embeds the
prompt (text, image and audio soft tokens, per-layer inputs); the
`CausalLM` runs the decoder layers of a nested `Gemma3nTextModel` itself,
and each layer carries mechanisms no paged layer of keras-vllm has: AltUp
(several hidden-state streams, predicted and corrected around each layer),
a Laurel low-rank residual branch, a per-layer input gate fed from a
second embedding table, Gaussian top-k activation sparsity in the FFN of
its first layers, and `Gemma3nTextAttention` (which also shares KV caches
between its last layers) has no paged subclass. After fine-tuning, its
`CausalLM.__call__` also reads a stale tied output head, so a forward pass
reference would have to be rebuilt too.

This module registers those pieces, read from the model, so that the
export refusal (`keras_vllm.export.capabilities`) names them.
"""

from keras_hub.src.models.gemma3n.gemma3n_backbone import Gemma3nBackbone

from keras_vllm.layers.common.registry import register_missing_capabilities


@register_missing_capabilities(Gemma3nBackbone)
def gemma3n_missing(backbone):
    """The mechanisms of this Gemma 3n decoder keras-vllm cannot serve."""
    text = backbone.language_model
    layers = int(text.num_hidden_layers)
    sparse = sum(1 for p in text.activation_sparsity_pattern or () if p)
    missing = [
        f"a decoder nested in the backbone (language_model, {layers} "
        "layers run by the CausalLM, not the backbone)",
        f"AltUp ({text.altup_num_inputs} hidden-state streams per layer)",
        f"Laurel residual blocks (rank {text.laurel_rank})",
        f"per-layer inputs ({text.hidden_size_per_layer_input} per layer, "
        f"from a {text.vocab_size_per_layer_input}-token table)",
    ]
    if sparse:
        missing.append(f"activation sparsity (Gaussian top-k, {sparse} layers)")
    missing.append(
        "a paged Gemma3nTextAttention"
        + (f" (KV shared by its last {text.num_kv_shared_layers} layers)"
           if text.num_kv_shared_layers else "")
    )
    encoders = [name for name in ("vision_encoder", "audio_encoder")
                if getattr(backbone, name, None) is not None]
    if encoders:
        missing.append(f"inputs of its {' and '.join(encoders)}")
    return missing
