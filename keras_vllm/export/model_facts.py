"""What an export reads from the live model before it writes anything:
that it can be exported at all, the preset it came from, its dtype and the
longest sequence to serve."""

import tempfile

from keras_vllm import format as fmt
from keras_vllm.hub import pairings
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
    check_pairings(causal_lm)


def check_pairings(causal_lm):
    """Refuses, by name and before anything is written, a model whose
    classes or tokenizer the loader would not take together
    (`keras_vllm.hub.pairings`: the rule both apply)."""
    backbone = causal_lm.backbone
    tokenizer = causal_lm.preprocessor.tokenizer
    problem = pairings.backbone_problem(type(causal_lm), type(backbone))
    fix = f"Wrap the {type(backbone).__name__} in its own task class."
    rows = backbone.get_config().get("vocabulary_size")
    if problem is None and isinstance(rows, int):
        problem = pairings.vocabulary_problem(
            int(tokenizer.vocabulary_size()), rows
        )
        fix = "Use the tokenizer the backbone was built for."
    if problem is None:
        problem = tokenizer_pairing_problem(causal_lm.preprocessor)
        fix = (
            "Build the preprocessor with the tokenizer class it names, or "
            f"use the preprocessor class written for the "
            f"{type(tokenizer).__name__}."
        )
    if problem is not None:
        raise UnsupportedModelError(
            f"{type(causal_lm).__name__} cannot be exported: {problem}. "
            f"keras-vllm would not load such an artifact. {fix} Nothing was "
            "written."
        )


def tokenizer_pairing_problem(preprocessor):
    """Why the loader would not take the preprocessor's tokenizer with it,
    or None: `pairings.tokenizer_problem` on the tokenizer as the export
    stores it (its serialized config and saved assets)."""
    from keras_vllm.export import sections

    tokenizer = preprocessor.tokenizer
    if pairings.takes_by_class(type(preprocessor), type(tokenizer)):
        return None
    with tempfile.TemporaryDirectory() as assets:
        tokenizer.save_assets(assets)
        config = fmt.tokenizer_args.completed_config(
            tokenizer, sections.serialize(tokenizer, "tokenizer")["config"]
        )
        return pairings.tokenizer_problem(
            type(preprocessor), type(tokenizer), config, assets,
            sections.TOKENIZER_PROBES,
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
