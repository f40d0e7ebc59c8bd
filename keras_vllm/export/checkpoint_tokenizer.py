"""Does the model's tokenizer still tokenize as its Hugging Face checkpoint?

keras-hub converts a checkpoint's tokenizer on `CausalLM.from_preset(dir)`.
A conversion can differ from the checkpoint's own tokenizer without an
error: keras-hub 0.32 reads every `model_type: llama` checkpoint's
`tokenizer.json` as a byte-level Llama 3 tokenizer, so a Llama 2 / TinyLlama
one (SentencePiece pieces, `▁` for spaces) loses its spaces ("the cat"
becomes "thecat"). The fine-tune, `generate()` and the served model then
agree with each other and all see other text than the checkpoint was
trained on. The export cannot repair that, but it says so: it tokenizes a
few plain sentences with both tokenizers (Hugging Face's `tokenizers`,
where installed) and warns when they differ.
"""

import logging

import numpy as np

from keras_vllm.hub import presets

logger = logging.getLogger("keras_vllm")

_FILE = "tokenizer.json"
PROBES = (
    "the cat sat on the mat",
    "Hello world! How are you today?",
)


def first_difference(keras_tokenizer, checkpoint_tokenizer):
    """The first probe the two tokenizers split differently, or None.

    Args:
        keras_tokenizer: the model's KerasHub tokenizer.
        checkpoint_tokenizer: a `tokenizers.Tokenizer`.

    Returns:
        `(text, keras_ids, checkpoint_ids)` or None.
    """
    for text in PROBES:
        ids = np.asarray(keras_tokenizer.tokenize(text)).ravel()
        ids = [int(i) for i in ids]
        theirs = checkpoint_tokenizer.encode(text, add_special_tokens=False).ids
        if ids != list(theirs):
            return text, ids, list(theirs)
    return None


def warn_if_converted_differently(keras_tokenizer, handle):
    """Warns when a Hugging Face checkpoint's `tokenizer.json` splits the
    probes otherwise than the model's tokenizer (see the module docstring).

    Does nothing for KerasHub presets, checkpoints without a
    `tokenizer.json`, or without the `tokenizers` package.

    Returns:
        The difference warned about, or None.
    """
    try:
        import tokenizers

        if presets.preset_format(presets.read_config(handle)) != "transformers":
            return None
        path = presets.optional_file(handle, _FILE)
        if path is None:
            return None
        checkpoint_tokenizer = tokenizers.Tokenizer.from_file(path)
        difference = first_difference(keras_tokenizer, checkpoint_tokenizer)
    except Exception:  # a diagnostic only: never fails an export
        return None
    if difference is not None:
        text, ids, theirs = difference
        logger.warning(
            "keras-vllm: the model's %s tokenizes %r as %s, but the "
            "checkpoint's own %s gives %s: keras-hub converted this "
            "checkpoint's tokenizer into another one. The model was "
            "fine-tuned, and will be served, on that tokenization. Build the "
            "family's tokenizer from the checkpoint's vocabulary files "
            "yourself (its `proto=` or `vocabulary=`/`merges=` arguments) "
            "before fine-tuning.",
            type(keras_tokenizer).__name__, text, ids, _FILE, theirs,
        )
    return difference
