"""A KerasHub tokenizer's vocabulary as vLLM's detokenizer needs it.

`Vocabulary` holds the id <-> piece tables and decodes ids and pieces
without running a Keras layer. Byte-level BPE pieces are mapped back to
bytes through GPT-2's byte alphabet (keras-hub's `bytes_to_unicode`) and
decoded jointly, so a character split across tokens is whole once its last
byte is there; other tokenizers (SentencePiece, WordPiece, ...) decode
through the native `detokenize()`.
"""

KIND_BPE = "byte_level_bpe"
KIND_SPM = "sentence_piece"
KIND_OTHER = "other"


def byte_decoder():
    """GPT-2's byte-level alphabet, inverted: {unicode char: byte}.

    Example:

    >>> byte_decoder()["\u0120"]  # "Ġ", the piece for a space
    32
    """
    from keras_hub.src.tokenizers.byte_pair_tokenizer import bytes_to_unicode

    byte_values, characters = bytes_to_unicode()
    # keras-hub gives the bytes as 1-byte `bytes` objects.
    return {ch: b[0] for b, ch in zip(byte_values, characters)}


def as_id_list(ids):
    """Token ids (int, numpy scalar/array, sequence) as a list of ints."""
    if hasattr(ids, "tolist"):  # numpy arrays and scalars
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


def _as_text(value):
    """A native detokenize() result (str, bytes, numpy/tensor) as str."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _bpe_bytes(token, byte_of):
    """A byte-level BPE piece's bytes; other characters as their UTF-8."""
    out = bytearray()
    for ch in token:
        b = byte_of.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


class Vocabulary:
    """Read-only id <-> piece tables of a native KerasHub tokenizer.

    Ids the tokenizer has no piece for (a model vocabulary padded beyond
    the tokenizer's, negative ids) are "outside": they have no piece and
    decode to nothing.

    Example:

    ```python
    vocab = Vocabulary(causal_lm.preprocessor.tokenizer)
    ids = [int(i) for i in causal_lm.preprocessor.tokenizer.tokenize("hi")]
    vocab.decode(ids)  # "hi"
    vocab.tokens_to_string(vocab.ids_to_tokens(ids))  # "hi"
    ```

    Args:
        tokenizer: a `keras_hub.tokenizers.Tokenizer`.
    """

    def __init__(self, tokenizer):
        from keras_hub.tokenizers import BytePairTokenizer
        from keras_hub.tokenizers import SentencePieceTokenizer

        self._tokenizer = tokenizer
        if isinstance(tokenizer, BytePairTokenizer):
            self.kind = KIND_BPE
            vocab = getattr(tokenizer, "vocabulary", None)
            if not isinstance(vocab, dict):
                vocab = {
                    t: int(tokenizer.token_to_id(t))
                    for t in tokenizer.get_vocabulary()
                }
            vocab = {str(t): int(i) for t, i in vocab.items()}
        else:
            self.kind = (
                KIND_SPM
                if isinstance(tokenizer, SentencePieceTokenizer)
                else KIND_OTHER
            )
            vocab = {}
            for i, t in enumerate(tokenizer.get_vocabulary()):
                if isinstance(t, bytes):
                    t = t.decode("utf-8", errors="replace")
                vocab.setdefault(str(t), i)

        id_to_token = [None] * (max(vocab.values(), default=-1) + 1)
        for t, i in vocab.items():
            if i >= 0:
                id_to_token[i] = t
        self.token_to_id = vocab
        self.id_to_token = id_to_token
        self.size = int(tokenizer.vocabulary_size())
        self.max_chars = max((len(t) for t in vocab), default=1) or 1

        self._token_bytes = {}
        self._byte_of = {}
        if self.kind == KIND_BPE:
            self._byte_of = byte_decoder()
            # Added special tokens ("<|endoftext|>") are not byte-encoded.
            unsplittable = set(
                getattr(tokenizer, "unsplittable_tokens", None) or ()
            )
            self._token_bytes = {
                t: t.encode("utf-8")
                if t in unsplittable
                else _bpe_bytes(t, self._byte_of)
                for t in vocab
            }

    def __len__(self):
        """The number of table slots (the largest id with a piece, plus 1)."""
        return len(self.id_to_token)

    def contains(self, token_id):
        """Whether `token_id` has a piece."""
        return (
            0 <= token_id < len(self.id_to_token)
            and self.id_to_token[token_id] is not None
        )

    def token(self, token_id):
        """The piece of `token_id`, or None outside the vocabulary."""
        if token_id is None or not 0 <= token_id < len(self.id_to_token):
            return None
        return self.id_to_token[token_id]

    def ids_to_tokens(self, ids, skip=()):
        """Pieces of `ids` ("" outside the vocabulary), leaving out `skip`."""
        table = self.id_to_token
        size = len(table)
        return [
            (table[i] or "") if 0 <= i < size else ""
            for i in as_id_list(ids)
            if i not in skip
        ]

    def tokens_to_string(self, tokens):
        """Decodes pieces jointly; unknown or empty pieces are skipped.

        An incomplete character at the end shows as U+FFFD, which vLLM's
        incremental detokenizer holds back until it completes.
        """
        if self.kind == KIND_BPE:
            data = b"".join(
                self._token_bytes.get(t) or _bpe_bytes(t, self._byte_of)
                for t in tokens
                if t
            )
            return data.decode("utf-8", errors="replace")
        vocab = self.token_to_id
        return self._decode_valid([vocab[t] for t in tokens if t and t in vocab])

    def decode(self, ids, skip=()):
        """Ids to text; ids outside the vocabulary and in `skip` dropped."""
        return self._decode_valid(
            [i for i in as_id_list(ids) if self.contains(i) and i not in skip]
        )

    def _decode_valid(self, ids):
        if not ids:
            return ""
        if self.kind == KIND_BPE:
            table = self.id_to_token
            return b"".join(self._token_bytes[table[i]] for i in ids).decode(
                "utf-8", errors="replace"
            )
        # `detokenize`, not `__call__`: see `native_ids`.
        return _as_text(self._tokenizer.detokenize(ids))

    def native_ids(self, text):
        """The native tokenizer's ids for `text`, as a list of ints."""
        # `tokenize`, not `__call__`: Keras' Layer.__call__ would start the
        # JAX runtime in vLLM's front-end process, which forks the engine.
        ids = self._tokenizer.tokenize(text)
        if hasattr(ids, "numpy"):
            ids = ids.numpy()
        return as_id_list(ids)
