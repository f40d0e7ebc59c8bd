"""Tiny tokenizers for every supported family, trained locally.

No tokenizer asset can be downloaded in tests, so each family's tokenizer is
trained on the spot from `keras_vllm.testing.data`:

- Byte-level BPE families (GPT-2, OPT, Llama 3, Qwen*, Falcon, Bloom,
  GPT-NeoX, SmolLM3) train a byte-level BPE with Hugging Face `tokenizers`. KerasHub's
  `BytePairTokenizer` wants merges as `"a b"` strings, not the `[a, b]` pairs
  newer `tokenizers` versions serialize, so merges are converted.
- SentencePiece families (Llama 2, Mistral, Mixtral, Gemma*, Phi-3) train a
  BPE SentencePiece model with `sentencepiece`, using byte fallback (every
  byte is representable, so no `<unk>` on unseen text), the identity
  normalizer and no whitespace collapsing, so that
  `detokenize(tokenize(x)) == x`. Gemma models use no dummy prefix, like the
  real Gemma vocabularies.

Every family's required special tokens are in the vocabulary. As in the real
vocabularies, BPE special tokens come after the learned entries (GPT-2,
Llama 3, Qwen, ...) or first (OPT, Bloom). Either way the hard-coded pad id 0
of GPT-2, Llama 3, Qwen, Falcon and GPT-NeoX is an ordinary token, never a
stop token: KerasHub's sampler stops before the first step when the padding
after a prompt holds a stop token id (pad id == end id), and `generate()`
then returns the bare prompt.

Training is deterministic and cached per process.
"""

import functools
import io
import json

import keras_hub

from keras_vllm.testing import data as data_lib

# Default vocabulary sizes. SentencePiece with byte fallback needs more than
# 256 byte pieces + the corpus characters + the meta pieces.
BPE_VOCABULARY_SIZE = 512
SENTENCE_PIECE_VOCABULARY_SIZE = 384

# Special tokens each byte-level BPE family's tokenizer requires, in id order.
# They follow the learned vocabulary except for `BPE_SPECIAL_TOKENS_FIRST`.
BPE_SPECIAL_TOKENS = {
    "gpt2": ("<|endoftext|>",),
    "opt": ("<pad>", "</s>"),
    "llama3": (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|eot_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
    ),
    "qwen": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen3": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen_moe": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen3_moe": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    # Qwen 3.5's tokenizer also registers its vision tokens.
    "qwen3_5": (
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
        "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    ),
    "falcon": ("<|endoftext|>",),
    "bloom": ("<unk>", "<s>", "</s>", "<pad>"),
    "gpt_neo_x": ("<|endoftext|>",),
    "smollm3": ("<|begin_of_text|>", "<|end_of_text|>", "<think>", "</think>"),
    "gpt_oss": ("<|endoftext|>",),
}

# Families whose real vocabularies start with their special tokens. Their
# pad token is a special token looked up in the vocabulary.
BPE_SPECIAL_TOKENS_FIRST = ("opt", "bloom")

# SentencePiece layouts: the ids and pieces of the meta tokens, and the
# user-defined symbols (extra special tokens) of each family.
_GEMMA_META = {
    "pad_id": 0,
    "eos_id": 1,
    "bos_id": 2,
    "unk_id": 3,
    "pad_piece": "<pad>",
    "eos_piece": "<eos>",
    "bos_piece": "<bos>",
    "unk_piece": "<unk>",
}
_LLAMA_META = {
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": -1,
    "unk_piece": "<unk>",
    "bos_piece": "<s>",
    "eos_piece": "</s>",
}
SENTENCE_PIECE_LAYOUTS = {
    "llama": dict(_LLAMA_META, user_defined_symbols=()),
    "gemma": dict(
        _GEMMA_META,
        user_defined_symbols=("<start_of_turn>", "<end_of_turn>"),
        add_dummy_prefix=False,
    ),
    # Gemma3Tokenizer(has_vision_tokens=True), the default, also needs the
    # image tokens.
    "gemma3": dict(
        _GEMMA_META,
        user_defined_symbols=(
            "<start_of_turn>",
            "<end_of_turn>",
            "<img>",
            "<start_of_image>",
            "<end_of_image>",
        ),
        add_dummy_prefix=False,
    ),
    # Gemma4Tokenizer's defaults (vision and video tokens) need its image
    # and video tokens.
    "gemma4": dict(
        _GEMMA_META,
        user_defined_symbols=("<|image>", "<|image|>", "<image|>", "<|video|>"),
        add_dummy_prefix=False,
    ),
    # Gemma3nTokenizer checks for its image, audio, turn and mask tokens.
    "gemma3n": dict(
        _GEMMA_META,
        user_defined_symbols=(
            "<start_of_turn>",
            "<end_of_turn>",
            "<image_soft_token>",
            "<audio_soft_token>",
            "<start_of_image>",
            "<end_of_image>",
            "<start_of_audio>",
            "<end_of_audio>",
            "<mask>",
            "[multimodal]",
        ),
        add_dummy_prefix=False,
    ),
    # Phi-3 starts with "<s>" and ends with "<|endoftext|>".
    "phi3": dict(
        _LLAMA_META,
        user_defined_symbols=(
            "<|endoftext|>",
            "<|user|>",
            "<|assistant|>",
            "<|end|>",
        ),
    ),
}

# family -> (tokenizer class name in `keras_hub.models`, asset kind, layout).
_TOKENIZERS = {
    "gpt2": ("GPT2Tokenizer", "bpe", "gpt2"),
    "opt": ("OPTTokenizer", "bpe", "opt"),
    "llama": ("LlamaTokenizer", "spm", "llama"),
    "llama3": ("Llama3Tokenizer", "bpe", "llama3"),
    "mistral": ("MistralTokenizer", "spm", "llama"),
    "mixtral": ("MixtralTokenizer", "spm", "llama"),
    "gemma": ("GemmaTokenizer", "spm", "gemma"),
    "gemma2": ("GemmaTokenizer", "spm", "gemma"),
    "gemma3": ("Gemma3Tokenizer", "spm", "gemma3"),
    "gemma4": ("Gemma4Tokenizer", "spm", "gemma4"),
    "gemma4_e2b": ("Gemma4Tokenizer", "spm", "gemma4"),
    "gemma3n": ("Gemma3nTokenizer", "spm", "gemma3n"),
    "qwen": ("QwenTokenizer", "bpe", "qwen"),
    "qwen3": ("Qwen3Tokenizer", "bpe", "qwen3"),
    "qwen_moe": ("QwenMoeTokenizer", "bpe", "qwen_moe"),
    "qwen3_moe": ("Qwen3MoeTokenizer", "bpe", "qwen3_moe"),
    "qwen3_5": ("Qwen3_5Tokenizer", "bpe", "qwen3_5"),
    "qwen3_5_moe": ("Qwen3_5MoeTokenizer", "bpe", "qwen3_5"),
    "phi3": ("Phi3Tokenizer", "spm", "phi3"),
    "falcon": ("FalconTokenizer", "bpe", "falcon"),
    "bloom": ("BloomTokenizer", "bpe", "bloom"),
    "gpt_neo_x": ("GPTNeoXTokenizer", "bpe", "gpt_neo_x"),
    "smollm3": ("SmolLM3Tokenizer", "bpe", "smollm3"),
    "gpt_oss": ("GptOssTokenizer", "bpe", "gpt_oss"),
}


@functools.lru_cache(maxsize=None)
def _train_byte_pair_cached(
    special_tokens, vocabulary_size, specials_first, fill
):
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocabulary_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(
        data_lib.tokenizer_training_text(), trainer=trainer
    )
    model = json.loads(tokenizer.to_str())["model"]
    # The trainer puts the special tokens first. Ids are free to permute:
    # merges refer to token strings, not ids.
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id]
    if fill:
        # Like the reserved tokens of real vocabularies: no merge makes
        # them, so no text encodes to them, but ids and embeddings exist.
        # Printable ASCII is its own byte-level symbol, so they decode.
        # Appended after the learned tokens (special tokens still first).
        tokens += [
            f"<|unused_{i}|>" for i in range(vocabulary_size - len(tokens))
        ]
    if not specials_first:
        tokens = tokens[len(special_tokens) :] + tokens[: len(special_tokens)]
    vocabulary = tuple((token, i) for i, token in enumerate(tokens))
    merges = tuple(
        merge if isinstance(merge, str) else " ".join(merge)
        for merge in model["merges"]
    )
    return vocabulary, merges


def train_byte_pair(
    special_tokens,
    vocabulary_size=BPE_VOCABULARY_SIZE,
    special_tokens_first=False,
    fill=False,
):
    """Trains a tiny byte-level BPE on the fixture corpus.

    Args:
        special_tokens: sequence of strings. Special tokens, given
            consecutive ids in this order.
        vocabulary_size: int. The target vocabulary size, special tokens and
            the 256 byte-level symbols included.
        special_tokens_first: bool. Whether the special tokens take the first
            ids (`0..len(special_tokens) - 1`) rather than the last ones.
        fill: bool. Where the corpus trains fewer tokens than
            `vocabulary_size` (it trains ~700), add unused tokens
            (`<|unused_N|>`, after the learned ones) up to that size.

    Returns:
        A `(vocabulary, merges)` tuple as `keras_hub.tokenizers.
        BytePairTokenizer` takes them: `vocabulary` is a fresh `dict` from
        token to id and `merges` a fresh `list` of `"a b"` strings.
    """
    vocabulary, merges = _train_byte_pair_cached(
        tuple(special_tokens),
        int(vocabulary_size),
        bool(special_tokens_first),
        bool(fill),
    )
    return dict(vocabulary), list(merges)


@functools.lru_cache(maxsize=None)
def _train_sentence_piece_cached(layout, vocabulary_size):
    import sentencepiece

    options = dict(SENTENCE_PIECE_LAYOUTS[layout])
    options["user_defined_symbols"] = list(options["user_defined_symbols"])
    options.setdefault("add_dummy_prefix", True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(data_lib.tokenizer_training_text()),
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        # Keep text as is: no NFKC rules (they also bloat the proto by
        # ~240 KB) and no whitespace collapsing, so round trips are exact.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        hard_vocab_limit=False,
        # Single-threaded training is deterministic.
        num_threads=1,
        minloglevel=2,
        **options,
    )
    return model.getvalue()


def train_sentence_piece(
    layout="llama", vocabulary_size=SENTENCE_PIECE_VOCABULARY_SIZE
):
    """Trains a tiny SentencePiece (BPE) model on the fixture corpus.

    Args:
        layout: string. One of `SENTENCE_PIECE_LAYOUTS`: `"llama"` (Llama 2,
            Mistral, Mixtral), `"gemma"` (Gemma 1 and 2), `"gemma3"` or
            `"phi3"`. Chooses the meta token pieces and ids, the extra special
            tokens and whether a dummy prefix is added.
        vocabulary_size: int. The target vocabulary size. It must exceed the
            256 byte-fallback pieces plus the corpus characters and the meta
            pieces.

    Returns:
        The serialized model proto, as `bytes`.
    """
    if layout not in SENTENCE_PIECE_LAYOUTS:
        raise ValueError(
            f"Unknown SentencePiece layout {layout!r}. Expected one of "
            f"{sorted(SENTENCE_PIECE_LAYOUTS)}."
        )
    return _train_sentence_piece_cached(layout, int(vocabulary_size))


def tokenizer_class(family):
    """Returns the KerasHub tokenizer class of a family."""
    _check_family(family)
    return getattr(keras_hub.models, _TOKENIZERS[family][0])


def build_tiny_tokenizer(family, vocabulary_size=None, fill=False):
    """Builds a family's KerasHub tokenizer on locally trained assets.

    Args:
        family: string. One of `keras_vllm.testing.FAMILIES`.
        vocabulary_size: int, optional. The target vocabulary size. Defaults
            to `BPE_VOCABULARY_SIZE` or `SENTENCE_PIECE_VOCABULARY_SIZE`.
        fill: bool. Reach `vocabulary_size` exactly, with unused tokens
            where the fixture corpus trains fewer (`train_byte_pair`,
            `fill_sentence_piece`), so a model built on the tokenizer has
            embeddings of a realistic size.

    Returns:
        A `keras_hub.tokenizers.Tokenizer` of the family's class, e.g. a
        `keras_hub.models.GemmaTokenizer` for `"gemma2"`. Equal inputs give
        equal assets, so two calls give tokenizers with identical ids.
    """
    _check_family(family)
    class_name, kind, layout = _TOKENIZERS[family]
    cls = getattr(keras_hub.models, class_name)
    if kind == "bpe":
        size = vocabulary_size or BPE_VOCABULARY_SIZE
        vocabulary, merges = train_byte_pair(
            BPE_SPECIAL_TOKENS[layout],
            size,
            special_tokens_first=layout in BPE_SPECIAL_TOKENS_FIRST,
            fill=fill,
        )
        return cls(vocabulary=vocabulary, merges=merges)
    size = vocabulary_size or SENTENCE_PIECE_VOCABULARY_SIZE
    if fill:
        return cls(proto=fill_sentence_piece(
            train_sentence_piece(layout, size), size
        ))
    return cls(proto=train_sentence_piece(layout, size))


def fill_sentence_piece(proto, vocabulary_size):
    """A SentencePiece model proto grown to `vocabulary_size` pieces.

    The added pieces (`<unused0>`, ...) have SentencePiece's UNUSED type:
    ids the encoder never produces, like the reserved pieces of real
    vocabularies (Gemma's), so text tokenizes as with `proto` while a model
    built on it has a real vocabulary's embeddings (262,144 rows for Gemma
    3).

    Args:
        proto: bytes. A serialized model proto (`train_sentence_piece`).
        vocabulary_size: int. The pieces wanted, at least `proto`'s.

    Returns:
        The serialized, grown model proto, as `bytes`.
    """
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    model = model_pb2.ModelProto()
    model.ParseFromString(proto)
    if vocabulary_size < len(model.pieces):
        raise ValueError(
            f"vocabulary_size={vocabulary_size} is below the "
            f"{len(model.pieces)} pieces the fixture corpus trains"
        )
    unused = model_pb2.ModelProto.SentencePiece.UNUSED
    for i in range(vocabulary_size - len(model.pieces)):
        model.pieces.add(piece=f"<unused{i}>", score=0.0, type=unused)
    return model.SerializeToString()


def _check_family(family):
    if family not in _TOKENIZERS:
        raise ValueError(
            f"Unknown family {family!r}. Expected one of {list(_TOKENIZERS)}."
        )
