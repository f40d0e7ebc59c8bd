"""Which keras-hub classes an artifact may put together: one rule, applied
by export before it writes and by the loader when it reads.

keras-hub's constructors take any backbone in a task and any tokenizer in a
preprocessor; each class names the one it was written for
(`CausalLM.backbone_cls`, `Preprocessor.tokenizer_cls`). keras-vllm exports
and serves:

- a task holding a backbone of its `backbone_cls` (or a subclass);
- a preprocessor holding a tokenizer of its `tokenizer_cls` (or a
  subclass), or of another class of the same vocabulary format: both
  classes, built from the tokenizer's stored config and assets, have the
  same special tokens (attribute, string and id), the same vocabulary size
  and the same ids for the probe texts. keras-hub 0.32's
  `Qwen3_5MoeCausalLMPreprocessor` holding a `Qwen3_5Tokenizer` is one (the
  two tokenizer classes differ only in the backbone they name); a
  `Qwen3CausalLMPreprocessor` holding a `GemmaTokenizer` is not;
- a tokenizer whose ids all index the backbone's token embedding.

Export refuses anything else by name before it writes a file
(`keras_vllm.export.model_facts.check_pairings`), and the loader
(`keras_vllm.load.class_checks`, `keras_vllm.load.keras_loader`) applies
the same functions to the artifact's classes and files, so a pairing the
loader refuses is one export never wrote.

Example:

```python
problem = tokenizer_problem(
    keras_hub.models.Qwen3_5MoeCausalLMPreprocessor,
    keras_hub.models.Qwen3_5Tokenizer,
    config, "tokenizer/assets", ["Hello world!"],
)
assert problem is None
```
"""

import numpy as np

from keras_vllm.format import tokenizer_args


def backbone_problem(task_cls, backbone_cls):
    """Why a task of class `task_cls` does not take a backbone of class
    `backbone_cls`, or None when it does."""
    expected = getattr(task_cls, "backbone_cls", None)
    if expected is None or issubclass(backbone_cls, expected):
        return None
    return (
        f"a {task_cls.__name__} takes a {expected.__name__}, and a "
        f"{backbone_cls.__name__} is not one"
    )


def vocabulary_problem(tokenizer_size, embedding_rows):
    """Why a tokenizer of `tokenizer_size` entries does not fit a backbone
    whose token embedding has `embedding_rows` rows (None: it fits, or the
    backbone declares no vocabulary size)."""
    if not isinstance(embedding_rows, int) or tokenizer_size <= embedding_rows:
        return None
    return (
        f"the tokenizer's vocabulary has {tokenizer_size} entries but the "
        f"backbone's embedding has {embedding_rows} rows "
        "('vocabulary_size'), so its ids would index past the embedding"
    )


def build_tokenizer(cls, config, assets):
    """A tokenizer of class `cls` from a stored config and asset directory,
    as the loader builds it (Keras' safe mode; keras-hub reads the assets'
    own confined paths outside it)."""
    from keras.src.saving.serialization_lib import SafeModeScope

    config = tokenizer_args.constructor_config(cls.__name__, config)
    with SafeModeScope(True):
        tokenizer = cls.from_config(config)
    tokenizer.load_assets(assets)
    return tokenizer


def _special_tokens(tokenizer):
    return {
        attr: (token, getattr(tokenizer, f"{attr}_id", None))
        for attr, token in tokenizer_args.special_tokens(tokenizer).items()
    }


def _ids(tokenizer, text):
    return [int(i) for i in np.asarray(tokenizer.tokenize(text)).reshape(-1)]


def _difference(ours, theirs, texts):
    """How `theirs` tokenizes differently from `ours`, or None."""
    if _special_tokens(ours) != _special_tokens(theirs):
        return "their special tokens differ"
    if int(ours.vocabulary_size()) != int(theirs.vocabulary_size()):
        return "their vocabulary sizes differ"
    for text in texts:
        if _ids(ours, text) != _ids(theirs, text):
            return f"they tokenize {text!r} differently"
    return None


def takes_by_class(preprocessor_cls, tokenizer_cls):
    """Whether the classes alone settle it: the tokenizer is of the
    preprocessor's `tokenizer_cls` (or the preprocessor names none)."""
    expected = getattr(preprocessor_cls, "tokenizer_cls", None)
    return expected is None or issubclass(tokenizer_cls, expected)


def tokenizer_problem(preprocessor_cls, tokenizer_cls, config, assets, texts):
    """Why a preprocessor of class `preprocessor_cls` does not take the
    tokenizer stored as `tokenizer_cls`, `config` and `assets`, or None.

    Reflection decides when the tokenizer is of the preprocessor's
    `tokenizer_cls` (or it declares none); otherwise both classes are built
    from the stored config and assets and compared on `texts`.

    Args:
        preprocessor_cls: the preprocessor's class.
        tokenizer_cls: the tokenizer's class.
        config: the tokenizer config as the artifact stores it (JSON).
        assets: the directory of the tokenizer's assets.
        texts: the probe texts to compare the two classes on.

    Returns:
        None, or a phrase naming the classes and the difference.
    """
    if takes_by_class(preprocessor_cls, tokenizer_cls):
        return None
    expected = preprocessor_cls.tokenizer_cls
    head = (
        f"a {preprocessor_cls.__name__} takes a {expected.__name__} or a "
        f"tokenizer of the same vocabulary format, and the "
        f"{tokenizer_cls.__name__} is not one"
    )
    built = []
    for cls in (tokenizer_cls, expected):
        try:
            built.append(build_tokenizer(cls, config, assets))
        except Exception as e:  # Keras and tokenizer libraries raise many
            return (
                f"{head}: its config and assets do not build a "
                f"{cls.__name__} ({type(e).__name__}: {str(e)[:150]})"
            )
    try:
        found = _difference(*built, texts)
    except Exception as e:  # tokenizer libraries raise many types
        found = f"tokenizing failed ({type(e).__name__}: {str(e)[:150]})"
    if found is None:
        return None
    return f"{head}: built from the same config and assets, {found}"
