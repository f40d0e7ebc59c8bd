"""`KerasVllmTokenizer`: a keras-vllm artifact's tokenizer as vLLM's."""

import os

from keras_vllm import format as fmt
from keras_vllm.hub import images
from keras_vllm.serve.tokenizer import chat
from keras_vllm.serve.tokenizer.chat_methods import ChatTemplateMethods
from keras_vllm.serve.tokenizer.chat_methods import batch_encoding
from keras_vllm.serve.tokenizer.special_tokens import SpecialTexts
from keras_vllm.serve.tokenizer.special_tokens import SpecialTokens
from keras_vllm.serve.tokenizer.vocabulary import KIND_SPM
from keras_vllm.serve.tokenizer.vocabulary import Vocabulary

try:
    from vllm.tokenizers.protocol import TokenizerLike
except ImportError:  # the tokenizer also works without vLLM
    TokenizerLike = object


def _rebuild(path, truncation_side):
    """Unpickling: reload from the artifact (tokenizers are not shipped)."""
    return KerasVllmTokenizer.from_pretrained(
        path, truncation_side=truncation_side
    )


class KerasVllmTokenizer(ChatTemplateMethods, TokenizerLike):
    """A keras-vllm artifact's KerasHub tokenizer behind vLLM's interface.

    Build it with `from_pretrained(artifact_dir)` (what vLLM calls). All
    tables are built at construction, so the object is read-only afterwards
    and safe to share between vLLM's renderer threads.

    Encoding is the native KerasHub tokenizer's, with the start token and
    the special tokens `CausalLM.generate()` uses (see `SpecialTokens`).

    Example:

    ```python
    tokenizer = KerasVllmTokenizer.from_pretrained("exports/my_model")
    ids = tokenizer.encode("the quick brown fox")
    tokenizer.decode(ids, skip_special_tokens=True)  # "the quick brown fox"
    tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    ```
    """

    def __init__(
        self,
        tokenizer,
        manifest,
        path,
        *,
        chat_template=None,
        truncation_side="left",
    ):
        """Wraps an already loaded native tokenizer.

        Args:
            tokenizer: the native `keras_hub.tokenizers.Tokenizer`.
            manifest: the artifact's manifest dict.
            path: the artifact directory (for `name_or_path` and pickling).
            chat_template: the artifact's Jinja chat template, or None.
            truncation_side: "left" (keep the end of an over-long prompt,
                vLLM's choice for generation) or "right".
        """
        self._tokenizer = tokenizer
        self._path = str(path)
        self.name_or_path = self._path
        self.truncation_side = truncation_side
        self.chat_template = chat_template
        self.model_max_length = int(
            manifest.get("max_sequence_length") or int(1e30)
        )

        # An artifact that serves images (format 1.10): prompts' image
        # markers expand as its preprocessor expands them.
        self._image = (
            fmt.image_settings(manifest)
            if "image" in fmt.served_modalities(manifest) else None
        )
        self._vocab = Vocabulary(tokenizer)
        self._special = SpecialTokens(manifest, tokenizer, self._vocab)
        self._special_texts = SpecialTexts(self._special, self._vocab)

        if self._vocab.kind == KIND_SPM:
            # vLLM's logprob token strings restore the leading spaces that
            # SentencePiece's decode() strips from single tokens, but only
            # for tokenizers it can inspect (HF fast ones). This is the
            # cache attribute its `get_leading_space_marker` reads first.
            self._vllm_space_marker_cache = "\u2581"

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id,
        *args,
        trust_remote_code=False,
        revision=None,
        download_dir=None,
        **kwargs,
    ):
        """Loads the tokenizer of the keras-vllm artifact at `path_or_repo_id`.

        The checksums of the files it reads (tokenizer assets, chat
        template) are verified, not the weights': vLLM loads a tokenizer in
        several processes, and the engine verifies the whole artifact
        (`KERAS_VLLM_PUBLIC_KEY`: its signature first, at every load). The
        tokenizer must reproduce the ids recorded at export
        (`keras_vllm.load_tokenizer`).
        `truncation_side` is honoured; vLLM's other keyword arguments (hub
        revision, download dir, ...) do not apply to a local artifact.
        """
        from keras_vllm.load.keras_loader import load_tokenizer
        from keras_vllm.load.opening import open_verified

        path = os.fspath(path_or_repo_id)
        # Verified (signature first, under a policy) and cross-checked here:
        # vLLM's front-end processes load the tokenizer before (or without)
        # the engine's own checks.
        opened = open_verified(
            path,
            only=(fmt.TOKENIZER_DIR + "/", fmt.CHAT_TEMPLATE_FILE),
            validate=True,
        )
        return cls(
            load_tokenizer(opened),
            opened.manifest,
            path,
            chat_template=chat.read_template(path),
            truncation_side=kwargs.get("truncation_side") or "left",
        )

    # -- copying and pickling ------------------------------------------------

    def __copy__(self):
        # HfRenderer copies the tokenizer; the tables are read-only, so a
        # copy shares them (and the native tokenizer) instead of reloading.
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return (_rebuild, (self._path, self.truncation_side))

    def __hash__(self):
        return hash(id(self))

    @property
    def truncation_side(self):
        """"left" or "right": the end `encode(truncation=True)` cuts."""
        return self._truncation_side

    @truncation_side.setter
    def truncation_side(self, side):
        # A property: `TokenizerLike` declares it as a (read-only) one.
        self._truncation_side = side

    # -- sizes and special tokens --------------------------------------------

    @property
    def is_fast(self):
        """False: vLLM uses its slow (Python) incremental detokenizer."""
        return False

    @property
    def vocab_size(self):
        return self._vocab.size

    @property
    def max_token_id(self):
        return len(self._vocab) - 1

    @property
    def max_chars_per_token(self):
        """Upper bound on the characters one token decodes to."""
        return self._vocab.max_chars

    def __len__(self):
        return max(self._vocab.size, len(self._vocab))

    @property
    def bos_token_id(self):
        return self._special.bos_id

    @property
    def eos_token_id(self):
        return self._special.eos_id

    @property
    def pad_token_id(self):
        return self._special.pad_id

    @property
    def bos_token(self):
        return self._vocab.token(self._special.bos_id)

    @property
    def eos_token(self):
        return self._vocab.token(self._special.eos_id)

    @property
    def pad_token(self):
        return self._vocab.token(self._special.pad_id)

    @property
    def all_special_ids(self):
        return list(self._special.sorted_ids)

    @property
    def all_special_tokens(self):
        return self._vocab.ids_to_tokens(self._special.sorted_ids)

    @property
    def add_bos_token(self):
        """Whether `encode()` prepends the start token (as generate() does)."""
        return self._special.add_bos

    def num_special_tokens_to_add(self):
        return 1 if self._special.add_bos else 0

    # -- vocabulary ----------------------------------------------------------

    def get_vocab(self):
        return dict(self._vocab.token_to_id)

    @property
    def vocabulary_kind(self):
        """How pieces encode text: `vocabulary.KIND_BPE` (GPT-2's byte
        alphabet), `KIND_SPM` (SentencePiece) or `KIND_OTHER`."""
        return self._vocab.kind

    @property
    def stop_token_ids(self):
        """The ids that end a generation (the artifact's stop tokens)."""
        return self._special.stop_ids

    @property
    def added_tokens_decoder(self):
        """`{id: AddedToken}` of the special tokens, as in HF tokenizers
        (vLLM keeps them out of structured outputs' JSON grammars)."""
        from tokenizers import AddedToken

        return {
            i: AddedToken(self._vocab.token(i), special=True)
            for i in self._special.sorted_ids
        }

    def get_added_tokens_decoder(self):
        return self.added_tokens_decoder

    def get_added_vocab(self):
        """Empty: a KerasHub vocabulary is one fixed table, nothing is added."""
        return {}

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        """Ids to vocabulary pieces; ids outside the vocabulary give "".

        A single int gives a single string, as in HF tokenizers.
        """
        skip = self._special.ids if skip_special_tokens else ()
        if isinstance(ids, int) or getattr(ids, "ndim", 1) == 0:
            tokens = self._vocab.ids_to_tokens([int(ids)], skip)
            return tokens[0] if tokens else None
        return self._vocab.ids_to_tokens(ids, skip)

    def convert_tokens_to_ids(self, tokens):
        """Pieces to ids; unknown pieces give None (there is no unk id)."""
        vocab = self._vocab.token_to_id
        if isinstance(tokens, str):
            return vocab.get(tokens)
        return [vocab.get(t) for t in tokens]

    def convert_tokens_to_string(self, tokens):
        """Decodes vocabulary pieces jointly.

        A character spread over several pieces is whole; an incomplete one
        at the end shows as U+FFFD (which vLLM's incremental detokenizer
        holds back until it completes). Unknown or empty pieces are skipped.
        """
        return self._vocab.tokens_to_string(tokens)

    # -- encode / decode -----------------------------------------------------

    def encode(
        self,
        text,
        truncation=None,
        max_length=None,
        add_special_tokens=True,
        **kwargs,
    ):
        """Text to ids, as `CausalLM.generate()` tokenizes a prompt.

        With `add_special_tokens=False` (vLLM's choice for a rendered chat,
        whose template writes its own special tokens, as with HF) the
        special tokens written as text (`<bos>`) become their ids for every
        tokenizer kind, as the model's preprocessor puts them; a plain
        prompt (`add_special_tokens=True`) is tokenized exactly as
        `generate()` tokenizes it, with the start token prepended.
        With `truncation` and `max_length`, the ids (start token included)
        are cut to `max_length` from `truncation_side`, keeping the start
        token, as HF tokenizers do. An artifact that serves images has
        each image marker expanded first, as its preprocessor does.
        """
        if not isinstance(text, str):
            raise TypeError(
                f"{type(self).__name__}.encode() takes one string, got "
                f"{type(text).__name__}."
            )
        if self._image is not None:
            text = images.expand_prompt(self._image, text)
        if add_special_tokens:
            ids = self._vocab.native_ids(text)
        else:
            ids = self._special_texts.encode(text)
        add_bos = add_special_tokens and self._special.add_bos
        prefix = [self._special.bos_id] if add_bos else []
        if truncation and max_length is not None:
            budget = max(int(max_length) - len(prefix), 0)
            if len(ids) > budget:
                if self.truncation_side == "left":
                    ids = ids[len(ids) - budget:]
                else:
                    ids = ids[:budget]
        return prefix + ids

    def __call__(
        self,
        text,
        text_pair=None,
        add_special_tokens=True,
        truncation=False,
        max_length=None,
        **kwargs,
    ):
        """HF-style call: `BatchEncoding` of `input_ids`, `attention_mask`."""
        if text_pair is not None:
            raise ValueError(
                f"{type(self).__name__} does not encode text pairs; a "
                "CausalLM prompt is one string."
            )
        if kwargs.get("return_offsets_mapping"):
            raise NotImplementedError(
                f"{type(self).__name__} does not produce offset mappings."
            )
        options = dict(
            truncation=truncation,
            max_length=max_length,
            add_special_tokens=add_special_tokens,
        )
        if isinstance(text, str):
            return batch_encoding(self.encode(text, **options))
        return batch_encoding([self.encode(t, **options) for t in text])

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        """Ids to text with the artifact's tokenizer.

        Ids outside the vocabulary are dropped; special tokens are dropped
        when `skip_special_tokens`.
        """
        skip = self._special.ids if skip_special_tokens else ()
        return self._vocab.decode(ids, skip)

    def batch_decode(self, sequences, skip_special_tokens=False, **kwargs):
        return [
            self.decode(ids, skip_special_tokens=skip_special_tokens)
            for ids in sequences
        ]

    def add_special_tokens(self, special_tokens_dict, *args, **kwargs):
        raise NotImplementedError(
            "A keras-vllm tokenizer's vocabulary is fixed by the exported "
            "model; tokens cannot be added (vLLM asks for this only for "
            "prompt embeddings, which keras-vllm does not serve)."
        )

    def __repr__(self):
        return (
            f"{type(self).__name__}(path={self._path!r}, "
            f"tokenizer={type(self._tokenizer).__name__}, "
            f"vocab_size={self._vocab.size})"
        )
