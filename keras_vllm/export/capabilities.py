"""Whether a `CausalLM` is a text decoder keras-vllm can serve at all.

keras-vllm serves one shape of model: a standalone `CausalLM` whose
backbone maps `token_ids` / `padding_mask` (and `position_ids`, fed from
vLLM's positions) to hidden states through paged attention layers, with logits from its reversible token embedding. Some
KerasHub `CausalLM` classes are something else (a speculative-decoding
drafter, a recurrent model, an image-conditioned decoder). Each is refused
here by its structure, with the class and the capability keras-vllm lacks,
before anything is written or any golden output is recorded. The checks
read structure, never a family's name, so a new KerasHub class is refused
(or served) without code changes; the attention gate
(`keras_vllm.layers.swap.check_servable`) runs with these.

A backbone that also takes non-text inputs (a vision encoder) is served
as its text decoder only when its family registers how
(`keras_vllm.layers.common.registry.register_text_decoder`).
"""

import inspect

from keras_vllm.errors import UnsupportedModelError

# The inputs the served model feeds the backbone (`serve/worker/model.py`):
# `position_ids` (when the backbone takes it) are vLLM's positions.
TEXT_INPUTS = ("token_ids", "padding_mask", "position_ids")


def _class_name(obj):
    return type(obj).__name__


def backbone_input_names(backbone):
    """The names of a functional backbone's inputs (empty when unknown)."""
    try:
        inputs = backbone.inputs or []
    except (AttributeError, ValueError):
        return []
    names = []
    for tensor in inputs:
        name = getattr(tensor, "name", None)
        if name:
            names.append(name.split(":")[0])
    return names


def extra_inputs(backbone):
    """The backbone's inputs besides `token_ids`, `padding_mask` and
    `position_ids`."""
    return [n for n in backbone_input_names(backbone) if n not in TEXT_INPUTS]


def takes_preprocessor(cls):
    """Whether a `CausalLM` class's constructor takes a `preprocessor` (an
    unreadable signature counts as yes)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return True
    return "preprocessor" in params


def preset_causal_lm_class(preset):
    """The `CausalLM` class to load a preset with, for export.

    keras-hub's `CausalLM.from_preset` picks any registered subclass whose
    backbone class is the preset's, and several can share one (a model and
    its speculative-decoding drafter); it picks among them in no fixed
    order. This returns the one standalone text generator among them when
    there is exactly one, else `keras_hub.models.CausalLM` (keras-hub's own
    choice).

    Args:
        preset: a preset handle or local directory (a Hugging Face
            checkpoint keras-hub converts included).

    Example:

    ```python
    cls = preset_causal_lm_class("./gemma4_tuned_preset")
    causal_lm = cls.from_preset("./gemma4_tuned_preset")
    ```
    """
    import keras_hub
    from keras_hub.src.utils import preset_utils

    backbone_cls = preset_utils.get_preset_loader(preset).check_backbone_class()
    standalone = [
        cls
        for cls in preset_utils.list_subclasses(keras_hub.models.CausalLM)
        if getattr(cls, "backbone_cls", None) is backbone_cls
        and takes_preprocessor(cls)
    ]
    if len(standalone) == 1:
        return standalone[0]
    return keras_hub.models.CausalLM


def check_standalone(causal_lm):
    """Refuses a `CausalLM` class that cannot generate on its own.

    A class whose constructor takes no `preprocessor` works alongside
    another model (KerasHub's speculative-decoding drafters): there is no
    text in, text out model to serve. A `Seq2SeqLM` (KerasHub files its
    encoder-decoder and audio-to-text tasks under `CausalLM`) decodes with
    cross-attention to an encoder's output, which vLLM's decoder-only
    paged serving has no place for.
    """
    import keras_hub

    if isinstance(causal_lm, keras_hub.models.Seq2SeqLM):
        raise UnsupportedModelError(
            f"{_class_name(causal_lm)} is an encoder-decoder model (a "
            "KerasHub Seq2SeqLM), so keras-vllm cannot export or serve it. "
            "Missing capability: encoder-decoder (cross-attention) serving; "
            "keras-vllm serves decoder-only CausalLMs."
        )
    if not takes_preprocessor(type(causal_lm)):
        raise UnsupportedModelError(
            f"{_class_name(causal_lm)} is not a standalone text generator "
            "(its constructor takes no preprocessor: it runs alongside "
            "another model, e.g. as a speculative-decoding draft model), so "
            "keras-vllm cannot export or serve it on its own. Missing "
            "capability: serving a draft model alone. Export the target "
            "model instead; a multi-token-prediction assistant "
            "drafts for its exported target in speculative decoding through "
            "`keras_vllm.export_assistant(assistant, path, target=...)`."
        )


def text_decoder_problems(causal_lm):
    """Why the backbone is no text decoder keras-vllm's model class can run
    (an empty list when it is one): it needs integer `hidden_dim` and
    `vocabulary_size`, logits from a reversible `token_embedding` with no
    cap on top, and no inputs besides `token_ids` / `padding_mask` /
    `position_ids` unless the family registers a text decoder for it.

    Each message names the `CausalLM` class and what keras-vllm lacks.
    """
    from keras_vllm.layers import swap

    backbone = causal_lm.backbone
    name = _class_name(causal_lm)
    missing = [
        attr for attr in ("hidden_dim", "vocabulary_size")
        if not isinstance(getattr(backbone, attr, None), int)
    ]
    if missing:
        # A family that registered its missing pieces is named by them;
        # otherwise the usual kinds of such models are listed.
        kinds = "" if swap.missing_capabilities(backbone) else (
            " (a recurrent state model, an encoder-decoder or an "
            "image-conditioned model)"
        )
        return [
            f"{name} cannot be served: its {_class_name(backbone)} has no "
            f"{' / '.join(missing)}, so it is not a single token-embedding "
            f"text decoder{kinds}. Missing capability: "
            + _missing_capability(backbone)
            + "."
        ]
    problems = []
    if getattr(causal_lm, "final_logit_cap", None) is not None:
        # The served logits are the backbone's head's (its own soft cap
        # included); a cap the task applies on top is not.
        problems.append(
            f"{name} cannot be served: it caps its logits outside the "
            f"backbone (final_logit_cap={causal_lm.final_logit_cap}). "
            "Missing capability: a logit transform after the backbone's "
            "output head. Build the model with final_logit_cap=None."
        )
    embedding = getattr(backbone, "token_embedding", None)
    if embedding is None or "reverse" not in _call_parameters(embedding):
        problems.append(
            f"{name} cannot be served: its {_class_name(backbone)} computes "
            "logits with a separate output head, not its reversible "
            "`token_embedding`. Missing capability: logits from a "
            "non-embedding output head."
        )
    extra = extra_inputs(backbone)
    if extra and swap.text_decoder_config(backbone) is None:
        problems.append(
            f"{name} cannot be served: its {_class_name(backbone)} takes "
            f"inputs {', '.join(extra)} besides token_ids and padding_mask, "
            "and keras-vllm serves text prompts only. Missing capability: "
            "those inputs on vLLM (images or other encoder inputs, prefix "
            "masks)."
        )
    return problems


def refusal(causal_lm):
    """Why keras-vllm cannot serve the model, or None when it can.

    The class-level refusals (`check_standalone`) raise; the others (no
    text decoder keras-vllm runs, an attention layer with no paged
    subclass) are returned, for `allow_unservable=True` to export the
    model for Keras-side use. Reads only the model's structure: it runs
    before the preprocessor is read or any golden output is recorded.
    """
    from keras_vllm.export.kv_layout import kv_layout

    check_standalone(causal_lm)
    problems = text_decoder_problems(causal_lm)
    if problems and not _has_sizes(causal_lm.backbone):
        return problems[0]
    try:
        kv_layout(causal_lm.backbone)
    except UnsupportedModelError as e:
        problems.append(str(e))
    if not problems:
        # A decoder keras-vllm runs whose family still names a piece it
        # has not verified (`registry.register_missing_capabilities`).
        from keras_vllm.layers import swap

        registered = swap.missing_capabilities(causal_lm.backbone)
        if registered:
            problems.append(
                f"{type(causal_lm).__name__} cannot be served: Missing "
                "capability: " + "; ".join(registered) + "."
            )
    if not problems:
        return None
    prefix = f"{type(causal_lm).__name__} cannot be served: "
    problems = [p.removeprefix(prefix).removeprefix("Also: ") for p in problems]
    return prefix + " Also: ".join(problems)


def _has_sizes(backbone):
    return all(
        isinstance(getattr(backbone, attr, None), int)
        for attr in ("hidden_dim", "vocabulary_size")
    )


def _call_parameters(layer):
    try:
        return inspect.signature(type(layer).call).parameters
    except (TypeError, ValueError):
        return {}


def _missing_capability(backbone):
    """What keras-vllm would need: what the backbone's family registered
    (`registry.register_missing_capabilities`), else read from the
    backbone's structure."""
    from keras_vllm.layers import swap

    registered = swap.missing_capabilities(backbone)
    if registered:
        return "; ".join(registered)
    extra = extra_inputs(backbone)
    if extra:
        return (
            f"inputs {', '.join(extra)} (images or other encoders feeding "
            "the decoder)"
        )
    return (
        "a decoder keras-vllm can find its hidden size, vocabulary and "
        "attention in (e.g. recurrent state caches or a nested language "
        "model)"
    )
