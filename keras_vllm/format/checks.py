"""Small checks shared by the format's readers (plain Python)."""

import math

from keras_vllm.errors import ArtifactError
from keras_vllm.format.names import MAX_GOLDEN_IDS


def fail(message):
    raise ArtifactError(message)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def check_token_id(value, vocab, where, nullable=True):
    if value is None and nullable:
        return
    if not is_int(value) or not 0 <= value < vocab:
        fail(
            f"Invalid artifact: {where} is {str(value)[:50]}, not a token id "
            f"below the vocabulary size {vocab}."
        )


def check_id_list(values, vocab, where, limit=MAX_GOLDEN_IDS):
    if not isinstance(values, list) or len(values) > limit:
        fail(f"Invalid artifact: {where} must be a list of token ids.")
    for value in values:
        check_token_id(value, vocab, where, nullable=False)
