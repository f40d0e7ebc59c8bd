"""Structured outputs (JSON schemas, regexes, choices, grammars) over a
keras-vllm artifact's tokenizer.

vLLM constrains decoding with xgrammar, which learns a tokenizer's
vocabulary through `xgrammar.TokenizerInfo.from_huggingface(tokenizer)`;
that knows Hugging Face, tiktoken and SentencePiece tokenizers only and
refuses `KerasVllmTokenizer` ("Unsupported tokenizer type"), so every
structured request to a keras-vllm model failed. `install()` lets it
describe ours: the pieces by id as `get_vocab()` gives them, their encoding
(GPT-2's byte alphabet for byte-level BPE, SentencePiece's "▁" and
`<0xNN>` byte pieces), whether encoding prepends a space, and the
artifact's stop tokens. vLLM then leaves the special tokens
(`added_tokens_decoder`) out of JSON grammars, as for any tokenizer.
Other tokenizers go to xgrammar's own code unchanged.
"""

from keras_vllm import patching
from keras_vllm.serve.tokenizer.vocabulary import KIND_BPE
from keras_vllm.serve.tokenizer.vocabulary import KIND_SPM

_MARKERS = {KIND_BPE: "\u0120", KIND_SPM: "\u2581"}  # "Ġ", "▁"


def tokenizer_info(tokenizer, vocab_size=None, stop_token_ids=None):
    """xgrammar's `TokenizerInfo` of a `KerasVllmTokenizer`.

    Args:
        tokenizer: a `KerasVllmTokenizer`.
        vocab_size: the model's vocabulary size (its logits), at least the
            tokenizer's; ids without a piece can never be generated.
        stop_token_ids: defaults to the artifact's stop tokens.

    Raises:
        ValueError: for a tokenizer that is neither byte-level BPE nor
            SentencePiece (xgrammar could not read its pieces).
    """
    import xgrammar as xgr

    kind = tokenizer.vocabulary_kind
    if kind not in _MARKERS:
        raise ValueError(
            "Structured outputs need a byte-level BPE or SentencePiece "
            f"tokenizer; this keras-vllm model's tokenizer is of kind "
            f"'{kind}'. Send the request without structured outputs."
        )
    pieces = tokenizer.get_vocab()
    size = max(vocab_size or 0, len(tokenizer))
    encoded = [""] * size
    for piece, token_id in pieces.items():
        if 0 <= token_id < size:
            encoded[token_id] = piece
    vocab_type = (
        xgr.VocabType.BYTE_LEVEL if kind == KIND_BPE
        else xgr.VocabType.BYTE_FALLBACK
    )
    if stop_token_ids is None:
        stop_token_ids = list(tokenizer.stop_token_ids)
    return xgr.TokenizerInfo(
        encoded,
        vocab_type=vocab_type,
        vocab_size=size,
        stop_token_ids=stop_token_ids or None,
        add_prefix_space=_adds_prefix_space(tokenizer, _MARKERS[kind]),
    )


def _adds_prefix_space(tokenizer, marker):
    """Whether encoding text prepends a space (a dummy prefix), as seen on
    one character."""
    ids = tokenizer.encode("a", add_special_tokens=False)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    return bool(pieces) and pieces[0].startswith(marker)


def install():
    """Lets xgrammar describe `KerasVllmTokenizer`s (keras-vllm's vLLM
    plugin calls this in every vLLM process; xgrammar is already imported
    there by vLLM's engine)."""
    import xgrammar as xgr

    from keras_vllm.serve.tokenizer.adapter import KerasVllmTokenizer

    def describing_ours(original):
        original = getattr(original, "__func__", original)

        def from_huggingface(tokenizer, *args, **kwargs):
            if isinstance(tokenizer, KerasVllmTokenizer):
                return tokenizer_info(tokenizer, *args, **kwargs)
            return original(tokenizer, *args, **kwargs)

        return staticmethod(from_huggingface)

    patching.replace(xgr.TokenizerInfo, "from_huggingface", describing_ours)
