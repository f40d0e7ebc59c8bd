"""Tiny, randomly initialised KerasHub CausalLMs for every supported family.

Each family's backbone keeps the shape of a real preset's config (the same
classes, flags and special mechanics: sliding windows, soft caps, q/k norms,
mixture of experts, ALiBi, partial rotary, RoPE scaling) but is shrunk to
2 layers (4 for SmolLM3, to reach its first layer without RoPE), hidden size
64, intermediate size 128, 4 query heads and 2 key/value heads (1 for
Gemma 1), with head size 16 (64 for GPT-OSS). Tokenizers are trained locally
(`keras_vllm.testing.tokenizers`), so nothing is downloaded.
"""

import os

import keras
import keras_hub
import numpy as np

from keras_vllm.testing import tokenizers as tokenizers_lib
from keras_vllm.testing.configs import FAMILIES  # noqa: F401
from keras_vllm.testing.configs import LLAMA3_1_ROPE_SCALING  # noqa: F401
from keras_vllm.testing.configs import NUM_LAYERS  # noqa: F401
from keras_vllm.testing.configs import PHI3_SU_ROPE_SCALING  # noqa: F401
from keras_vllm.testing.configs import SPECS
from keras_vllm.testing.configs import VOCABULARY_KEYS
from keras_vllm.testing.inputs import with_position_ids

def _check_family(family):
    if family not in SPECS:
        raise ValueError(
            f"Unknown family {family!r}. Expected one of {FAMILIES}."
        )


def backbone_config(family, vocabulary_size=None, **overrides):
    """Returns the tiny backbone constructor arguments of a family.

    Args:
        family: string. One of `FAMILIES`.
        vocabulary_size: int, optional. Fills in the backbone's vocabulary
            arguments (`vocabulary_size`, or the family's own names, e.g.
            Gemma 3n's `text_vocab_size` and `vocab_size_per_layer_input`).
        **overrides: backbone constructor arguments replacing the defaults.

    Returns:
        A dict of keyword arguments for the family's backbone class, without
        its vocabulary sizes unless `vocabulary_size` is given.

    Example:

    ```python
    config = backbone_config("gemma3n", vocabulary_size=256)
    backbone = backbone_class("gemma3n")(**config)
    ```
    """
    _check_family(family)
    config = dict(SPECS[family][1])
    if vocabulary_size is not None:
        for key in VOCABULARY_KEYS.get(family, ("vocabulary_size",)):
            config[key] = int(vocabulary_size)
    config.update(overrides)
    return config


def causal_lm_class(family):
    """Returns the `keras_hub.models.CausalLM` subclass of a family."""
    _check_family(family)
    return getattr(keras_hub.models, SPECS[family][0] + "CausalLM")


def backbone_class(family):
    """Returns the `keras_hub.models.Backbone` subclass of a family."""
    _check_family(family)
    return getattr(keras_hub.models, SPECS[family][0] + "Backbone")


# Families whose own preprocessor asserts TensorFlow in its constructor
# (keras-hub 0.32), even for text only.
_TENSORFLOW_PREPROCESSORS = ("gemma4", "gemma4_e2b", "gemma3n")


def _keras_hub_has_tensorflow():
    """Whether keras-hub runs with TensorFlow in this process: the check
    keras-hub's own `assert_tf_installed` makes."""
    from keras_hub.src.utils import tensor_utils

    return tensor_utils.tf is not None


def _preprocessor_class(family):
    if family == "gemma3":
        # `Gemma3CausalLMPreprocessor` needs TensorFlow (its constructor
        # asserts it), and a preset saved with it cannot be loaded without
        # TensorFlow. The generic preprocessor handles text-only Gemma 3.
        return keras_hub.models.CausalLMPreprocessor
    if family in _TENSORFLOW_PREPROCESSORS and not _keras_hub_has_tensorflow():
        # Gemma 4's and Gemma 3n's preprocessors assert TensorFlow too, and
        # the TPU tier's host has none (nor does a serving process, which
        # imports keras-hub without it). Without converters they prepare
        # text as the generic one does: the start token, no end token in
        # `generate_preprocess`, the pad id after the prompt, so the same
        # ids and `generate()` tokens. They differ in `__call__` (their
        # `{"prompts", "responses"}` input, which `fine_tune` bypasses) and
        # in keeping `<start_of_image>`-like markers in detokenized text.
        # Where TensorFlow runs, the family's own class stays, so exports
        # record it as a user's would.
        return keras_hub.models.CausalLMPreprocessor
    return getattr(
        keras_hub.models, SPECS[family][0] + "CausalLMPreprocessor"
    )


def build_tiny_causal_lm(
    family,
    *,
    seed=0,
    dtype=None,
    sequence_length=64,
    filled_vocabulary=None,
    **overrides,
):
    """Builds a tiny, randomly initialised CausalLM of a family, offline.

    The model has the family's tokenizer (trained locally), preprocessor,
    backbone and task classes, and is compiled with the greedy sampler.
    Text-only Gemma 3 uses the generic
    `keras_hub.models.CausalLMPreprocessor`, which, unlike
    `Gemma3CausalLMPreprocessor`, needs no TensorFlow; so do Gemma 4 and
    Gemma 3n where keras-hub runs without TensorFlow (their own
    preprocessors assert it), with the same text-only tokens.

    Every layer is built before the model is returned: where the functional
    backbone leaves one unbuilt, by one eager call (Bloom's `AlibiBias` must
    be built outside of any NNX trace).

    Example:

    ```python
    causal_lm = build_tiny_causal_lm("gemma2")
    causal_lm.generate("the quick brown", max_length=16)
    ```

    Args:
        family: string. One of `FAMILIES`.
        seed: int. Seeds Keras' global random state before the weights are
            initialised (`keras.utils.set_random_seed`), so equal arguments
            give equal weights.
        dtype: string or `keras.DTypePolicy`, optional. The backbone's dtype
            policy, e.g. `"bfloat16"`. Defaults to Keras' global policy.
        sequence_length: int. The preprocessor's sequence length (the
            default `max_length` of `generate()`).
        filled_vocabulary: int, optional. The tokenizer (and so the
            embeddings) gets exactly this many tokens, filled up with unused
            ones past what the fixture corpus trains
            (`build_tiny_tokenizer(..., fill=True)`).
        **overrides: backbone constructor arguments replacing the tiny
            defaults, e.g. `num_layers=6` or `**PHI3_SU_ROPE_SCALING`.

    Returns:
        A `keras_hub.models.CausalLM` of the family's class.
    """
    _check_family(family)
    keras.utils.set_random_seed(seed)
    tokenizer = tokenizers_lib.build_tiny_tokenizer(
        family, filled_vocabulary, fill=bool(filled_vocabulary)
    )
    config = backbone_config(
        family, vocabulary_size=tokenizer.vocabulary_size(), **overrides
    )
    if dtype is not None:
        config["dtype"] = dtype
    backbone = backbone_class(family)(**config)
    preprocessor = _preprocessor_class(family)(
        tokenizer=tokenizer, sequence_length=sequence_length
    )
    causal_lm = causal_lm_class(family)(
        backbone=backbone, preprocessor=preprocessor
    )
    causal_lm.compile(sampler="greedy")
    # A functional backbone builds its layers as it is constructed; one
    # eager call builds those it does not (Bloom's `AlibiBias`). Only then:
    # eagerly, each op runs on its own (~25 s for Qwen 3.5's chunked delta
    # rule on a CPU host).
    if any(not layer.built for layer in backbone._flatten_layers()):
        causal_lm(
            with_position_ids(
                causal_lm,
                {
                    "token_ids": np.ones((1, 8), dtype="int32"),
                    "padding_mask": np.ones((1, 8), dtype=bool),
                },
            )
        )
    return causal_lm


def save_tiny_preset(causal_lm, directory):
    """Saves a CausalLM as a local preset directory.

    This is a plain `causal_lm.save_to_preset(directory)`; the directory
    stands in for a Kaggle or Hugging Face preset and loads with
    `keras_hub.models.CausalLM.from_preset(directory)`.

    Args:
        causal_lm: a `keras_hub.models.CausalLM`.
        directory: string or path-like. The preset directory to write.

    Returns:
        The preset directory, as a string.
    """
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    causal_lm.save_to_preset(directory)
    return directory
