"""What an export reads from the live model before it writes anything:
that it can be exported at all, the preset it came from, its dtype and the
longest sequence to serve."""

from keras_vllm import format as fmt
from keras_vllm.hub import presets
from keras_vllm.errors import ExportError
from keras_vllm.errors import UnsupportedModelError


def check_model(causal_lm):
    import keras
    import keras_hub

    if not isinstance(causal_lm, keras_hub.models.CausalLM):
        raise UnsupportedModelError(
            f"export_vllm() takes a keras_hub.models.CausalLM, got "
            f"{type(causal_lm).__name__}. Wrap your backbone in its family's "
            "CausalLM (e.g. `keras_hub.models.GemmaCausalLM(backbone, "
            "preprocessor)`)."
        )
    if keras.config.backend() != "jax":
        raise ExportError(
            f"Keras runs on the '{keras.config.backend()}' backend; keras-vllm "
            "needs JAX. Set KERAS_BACKEND=jax before importing keras."
        )


def check_preprocessor(causal_lm):
    if causal_lm.preprocessor is None or getattr(
        causal_lm.preprocessor, "tokenizer", None
    ) is None:
        raise UnsupportedModelError(
            "The CausalLM has no preprocessor with a tokenizer; the artifact "
            "must carry the tokenizer. Attach the family's preprocessor "
            "before exporting."
        )


def preset_handle(causal_lm, preset):
    if preset is None:
        for obj in (causal_lm, causal_lm.backbone):
            preset = getattr(obj, "_keras_vllm_preset", None)
            if preset:
                break
    if not preset:
        return None
    return presets.resolve_handle(preset)


def dtype_name(backbone):
    name = backbone.dtype_policy.variable_dtype
    if name not in fmt.SUPPORTED_DTYPES:
        raise UnsupportedModelError(
            f"Variables of dtype {name} are not supported (quantized or "
            f"mixed maps); supported: {fmt.SUPPORTED_DTYPES}."
        )
    return name


def max_sequence_length(causal_lm, requested, handle):
    if requested is not None:
        return int(requested)
    declared = causal_lm.backbone.get_config().get("max_sequence_length")
    if declared:
        return int(declared)
    # Rotary models declare no maximum; serve what such models commonly
    # train at, never less than the preprocessor length the model used,
    # nor more than a Hugging Face checkpoint's own limit.
    length = max(int(causal_lm.preprocessor.sequence_length or 0), 2048)
    limit = presets.declared_max_positions(handle) if handle else None
    return min(length, limit) if limit else length
