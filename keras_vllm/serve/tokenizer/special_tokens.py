"""An artifact's special tokens, as `CausalLM.generate()` uses them, and
their texts in a rendered chat."""

import re


def _optional_int(value):
    return None if value is None else int(value)


class SpecialTokens:
    """Start, end-of-sequence and padding ids, and the ids decoding skips.

    The start token is prepended exactly when `generate()` prepends it (the
    exported preprocessor's `add_start_token`, and a start token exists).
    The end-of-sequence id is the artifact's first stop token (else the
    tokenizer's end token). The skipped ids (`skip_special_tokens`) are the
    native tokenizer's special tokens, the start and end tokens and the
    stop tokens (what `generate()` strips), those that have a piece.

    Example:

    ```python
    special = SpecialTokens(manifest, native_tokenizer, Vocabulary(native))
    special.add_bos, special.bos_id, special.eos_id, special.sorted_ids
    ```

    Args:
        manifest: the artifact's manifest dict.
        tokenizer: the native `keras_hub.tokenizers.Tokenizer`.
        vocabulary: its `Vocabulary`.
    """

    def __init__(self, manifest, tokenizer, vocabulary):
        section = manifest.get("tokenizer", {})
        preprocessor = manifest.get("preprocessor", {}).get("config", {})
        end = _optional_int(section.get("end_token_id"))
        stops = [int(i) for i in manifest.get("stop_token_ids") or []]

        self.bos_id = _optional_int(section.get("start_token_id"))
        self.add_bos = bool(preprocessor.get("add_start_token", False)) and (
            self.bos_id is not None
        )
        self.eos_id = stops[0] if stops else end
        # What ends a generation (structured outputs' grammars end there).
        self.stop_ids = tuple(stops) if stops else (
            (end,) if end is not None else ()
        )
        self.pad_id = _optional_int(section.get("pad_token_id"))

        special = set(stops)
        try:
            special.update(int(i) for i in tokenizer.special_token_ids)
        except (AttributeError, ValueError, TypeError):
            pass  # a tokenizer without special tokens of its own
        special.update(i for i in (self.bos_id, end) if i is not None)
        self.ids = frozenset(i for i in special if vocabulary.contains(i))
        self.sorted_ids = sorted(self.ids)


class SpecialTexts:
    """Turns special tokens written as text (a chat template's
    `{{ bos_token }}` renders as `<bos>`) into their ids.

    Only the special tokens the native tokenizer does not already encode as
    themselves are matched: a byte-level BPE tokenizer's unsplittable
    tokens and SentencePiece's user-defined symbols already are, while
    SentencePiece's control symbols (`<bos>`, `<eos>`, `<pad>`) would be
    split into characters. Every other stretch of text is encoded natively.

    Example:

    ```python
    texts = SpecialTexts(special, vocabulary)
    texts.encode("<bos>hi")  # [start id] + the native ids of "hi"
    ```

    Args:
        special: the artifact's `SpecialTokens`.
        vocabulary: its `Vocabulary`.
    """

    def __init__(self, special, vocabulary):
        self._vocabulary = vocabulary
        self.ids = {}
        for token_id in special.sorted_ids:
            piece = vocabulary.token(token_id)
            if piece and vocabulary.native_ids(piece) != [token_id]:
                self.ids[piece] = token_id
        # Longest first: a piece that is a prefix of another never wins.
        self._pattern = (
            re.compile(
                "|".join(
                    re.escape(p) for p in sorted(self.ids, key=len, reverse=True)
                )
            )
            if self.ids
            else None
        )

    def encode(self, text):
        """`text`'s ids, each special token's text as its id."""
        if self._pattern is None:
            return self._vocabulary.native_ids(text)
        ids, start = [], 0
        for match in self._pattern.finditer(text):
            if match.start() > start:
                ids += self._vocabulary.native_ids(text[start:match.start()])
            ids.append(self.ids[match.group()])
            start = match.end()
        if start < len(text):
            ids += self._vocabulary.native_ids(text[start:])
        return ids
