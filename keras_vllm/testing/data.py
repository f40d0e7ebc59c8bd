"""A tiny, deterministic text corpus for offline fixtures.

The corpus serves two purposes:

1. It is the training text for the tiny tokenizers in
   `keras_vllm.testing.tokenizers` (together with the Zen of Python, which
   adds some vocabulary variety).
2. It is the fine-tuning set of `keras_vllm.testing.fine_tune`. Every sentence
   starts with different words, so once a tiny model has memorized the
   corpus, its greedy continuation of a sentence's first words is that
   sentence's rest: continuations depend on the prompt.
"""

import codecs
import contextlib
import io

# Each sentence opens with words no other sentence opens with. Keep them
# short: a 2-layer model memorizes a dozen of these in a few dozen steps.
_SENTENCES = (
    "the quick brown fox jumps over the lazy dog.",
    "one two three four five six seven eight nine ten.",
    "earth is round and the sky is blue.",
    "hello world, keras hub says hi.",
    "monday tuesday wednesday thursday friday.",
    "red orange yellow green blue indigo violet.",
    "to be or not to be, that is the question.",
    "water is wet and fire is hot.",
    "alpha beta gamma delta epsilon zeta.",
    "keras models export to vllm on tpu.",
    "héllo wörld, ça va? 日本 is japan.",
    "a b c d e f g h i j k.",
)

# Prompts whose greedy continuations differ once the corpus is memorized.
PROMPTS = (
    "the quick brown",
    "one two three",
    "red orange",
    "monday tuesday",
    "to be or",
    "alpha beta",
)


def corpus():
    """Returns the fine-tuning corpus.

    Returns:
        A list of short strings. The same list (by value) on every call.
    """
    return list(_SENTENCES)


def prompts():
    """Returns prompts whose continuations differ after `fine_tune`.

    Each prompt is the opening of one `corpus()` sentence.

    Returns:
        A list of strings.
    """
    return list(PROMPTS)


def tokenizer_training_text():
    """Returns the text the tiny tokenizers are trained on.

    This is `corpus()` plus the Zen of Python (from the standard library, so
    it works offline), which gives byte-pair merges and SentencePiece pieces
    enough material to fill a vocabulary of a few hundred entries.

    Returns:
        A list of strings.
    """
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # Prints the Zen on first import.
    zen = codecs.decode(this.s, "rot13").splitlines()
    return corpus() + [line for line in zen if line.strip()]
