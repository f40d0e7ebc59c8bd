"""Tokenizer constructor arguments that KerasHub's `get_config()` leaves out.

An artifact rebuilds its tokenizer as `cls.from_config(config)` plus the
stored assets, so the config must hold everything the constructor was
given. Some KerasHub tokenizers take arguments their `get_config()` does
not return: keras-hub 0.32's `Llama3Tokenizer` takes `bos_token`,
`eos_token` and `misc_special_tokens`, which its Hugging Face converter fills
from the checkpoint (`tokenizer_config.json`, `tokenizer.json`'s added
tokens), as every `model_type: llama` checkpoint with a `tokenizer.json`
becomes a `Llama3Tokenizer`. Rebuilt from its config alone it falls back to
Llama 3's own special tokens: a vocabulary without them (TinyLlama's,
SmolLM's, a team's own) does not load at all, and one with more of them
(Llama 3 itself: `<|eot_id|>`, `<|python_tag|>`, ...) no longer keeps the
others whole.

`EXTRA_ARGUMENTS` lists, per tokenizer class, how to read those arguments
from a live tokenizer (export) and how to check and restore their
constructor types from JSON (load). An export stores them only where they
differ from the constructor's defaults (format 1.5), so a Llama 3
tokenizer with Llama 3's own tokens is stored as before.
"""

from keras_vllm.errors import ArtifactError

# At most this many stored special tokens, each at most this long.
_MAX_TOKENS = 4096
_MAX_TOKEN_CHARS = 256


def special_tokens(tokenizer):
    """A KerasHub tokenizer's special tokens, `{attribute: token}` (those
    its constructor registered with `_add_special_token`)."""
    attrs = getattr(tokenizer, "_special_token_attrs", None) or ()
    return {a: getattr(tokenizer, a) for a in attrs}


def _llama3_read(tokenizer):
    return {
        "bos_token": tokenizer.start_token,
        "eos_token": tokenizer.end_token,
        # Stored sorted: the constructor takes a set.
        "misc_special_tokens": sorted(
            token
            for attr, token in special_tokens(tokenizer).items()
            if attr.startswith("special_token_")
        ),
    }


# class name -> (argument -> "token" or "token set", read from a live
# tokenizer). A "token set" is stored as a sorted list and given to the
# constructor as a set.
EXTRA_ARGUMENTS = {
    "Llama3Tokenizer": (
        {
            "bos_token": "token",
            "eos_token": "token",
            "misc_special_tokens": "token set",
        },
        _llama3_read,
    ),
}


def _defaults(cls):
    import inspect

    params = inspect.signature(cls.__init__).parameters
    return {name: p.default for name, p in params.items()}


def _comparable(value):
    return sorted(value) if isinstance(value, (set, frozenset)) else value


def completed_config(tokenizer, config):
    """`config` plus the constructor arguments `get_config()` left out
    that differ from the class's defaults.

    Args:
        tokenizer: the live KerasHub tokenizer being exported.
        config: its `get_config()` (JSON-ready).

    Returns:
        A new config dict.
    """
    cls = type(tokenizer)
    entry = EXTRA_ARGUMENTS.get(cls.__name__)
    if entry is None:
        return dict(config)
    kinds, read = entry
    defaults = _defaults(cls)
    values = read(tokenizer)
    extra = {
        name: values[name]
        for name in kinds
        if name not in config
        and _comparable(values[name]) != _comparable(defaults.get(name))
    }
    return dict(config, **extra)


def _check_token(value, where):
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_TOKEN_CHARS:
        raise ArtifactError(
            f"The artifact's {where} is not a special token (a string of 1 to "
            f"{_MAX_TOKEN_CHARS} characters). The manifest was altered; "
            "re-export the model."
        )


def constructor_config(class_name, config):
    """Checks the stored extra arguments of `class_name`'s config and
    returns the config with their constructor types restored.

    Raises:
        ArtifactError: an extra argument that is not what the export writes.
    """
    entry = EXTRA_ARGUMENTS.get(class_name)
    if entry is None:
        return config
    kinds, _ = entry
    restored = dict(config)
    for name, kind in kinds.items():
        if name not in config:
            continue
        value = config[name]
        where = f"tokenizer.config.{name}"
        if kind == "token":
            _check_token(value, where)
            continue
        if not isinstance(value, list) or len(value) > _MAX_TOKENS:
            raise ArtifactError(
                f"The artifact's {where} is not a list of at most "
                f"{_MAX_TOKENS} tokens. The manifest was altered; re-export "
                "the model."
            )
        for token in value:
            _check_token(token, where)
        restored[name] = set(value)
    return restored
