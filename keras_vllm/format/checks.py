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


def invalid_unless(condition, message):
    """Raises `ArtifactError("Invalid manifest: ...")` unless `condition`."""
    if not condition:
        raise ArtifactError(f"Invalid manifest: {message}")


def field(obj, key, kind, where):
    """`obj[key]`, checked to be of `kind` (a type or a tuple of types;
    a bool is never taken for an int)."""
    invalid_unless(isinstance(obj, dict), f"'{where}' must be an object.")
    invalid_unless(key in obj, f"missing field '{where}.{key}'.")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (
        isinstance(value, bool) and bool not in kinds
    )
    invalid_unless(ok, f"'{where}.{key}' must be {_kind_name(kinds)}.")
    return value


def _kind_name(kinds):
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
        list: "a list",
        type(None): "null",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def is_sha256(digest):
    """A lowercase hex SHA-256 string."""
    return (
        isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )
