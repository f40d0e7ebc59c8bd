"""Quick fine-tuning that makes tiny models' continuations prompt-dependent.

A randomly initialised tiny model tends to repeat one token whatever the
prompt, so comparing its served output with `generate()` proves little.
`fine_tune` trains it for a few dozen full-batch steps on `corpus()` until it
has memorized the sentences; afterwards the greedy continuation of a
sentence's first words is the rest of that sentence.
"""

import keras
import numpy as np

from keras_vllm.testing import data as data_lib
from keras_vllm.testing.inputs import with_position_ids

DEFAULT_STEPS = 100
DEFAULT_LEARNING_RATE = 1e-2


def tokenize_corpus(tokenizer, texts=None, sequence_length=None):
    """Packs texts into next-token training arrays, without a preprocessor.

    Each text becomes `[start] + tokens + [end]` (no start token for
    families without one, e.g. Qwen), right-padded with the pad id, as
    `CausalLMPreprocessor` packs them.

    Args:
        tokenizer: a `keras_hub.tokenizers.Tokenizer`.
        texts: list of strings, optional. Defaults to `corpus()`.
        sequence_length: int, optional. The length of the packed inputs.
            Defaults to the longest packed text rounded up to a multiple of 8.
            Longer texts are truncated.

    Returns:
        An `(x, y, sample_weight)` tuple of numpy arrays: `x` is a dict with
        `"token_ids"` and `"padding_mask"` of shape
        `(len(texts), sequence_length)`, `y` the next-token ids and
        `sample_weight` 1 where `y` is a real token.
    """
    texts = data_lib.corpus() if texts is None else list(texts)
    start = getattr(tokenizer, "start_token_id", None)
    end = tokenizer.end_token_id
    pad = tokenizer.pad_token_id or 0
    rows = []
    for text in texts:
        ids = [int(i) for i in np.asarray(tokenizer.tokenize(text))]
        rows.append(([start] if start is not None else []) + ids + [end])
    if sequence_length is None:
        longest = max(len(row) for row in rows) - 1
        sequence_length = -(-longest // 8) * 8
    packed = np.full((len(rows), sequence_length + 1), pad, dtype="int32")
    mask = np.zeros((len(rows), sequence_length + 1), dtype=bool)
    for i, row in enumerate(rows):
        row = row[: sequence_length + 1]
        packed[i, : len(row)] = row
        mask[i, : len(row)] = True
    x = {"token_ids": packed[:, :-1], "padding_mask": mask[:, :-1]}
    return x, packed[:, 1:], mask[:, 1:].astype("float32")


def fine_tune(
    causal_lm,
    *,
    steps=DEFAULT_STEPS,
    seed=0,
    learning_rate=DEFAULT_LEARNING_RATE,
    texts=None,
):
    """Trains a CausalLM on token ids of `corpus()` for a few steps.

    Training uses full batches of token ids, so it needs neither TensorFlow
    nor grain: it calls `keras.Model.fit` directly, bypassing KerasHub's
    string preprocessing. The model is compiled with Adam at a high learning
    rate for training and afterwards recompiled for generation with its
    previous sampler (and KerasHub's default optimizer).

    Args:
        causal_lm: a `keras_hub.models.CausalLM` with a preprocessor (its
            tokenizer packs the texts).
        steps: int. The number of optimizer steps (full batches).
        seed: int. Seeds Keras' global random state before training, so
            equal models and arguments give equal weights.
        learning_rate: float. Adam's learning rate.
        texts: list of strings, optional. Defaults to `corpus()`.

    Returns:
        A list of the `steps` training losses, one per step.
    """
    tokenizer = causal_lm.preprocessor.tokenizer
    x, y, sample_weight = tokenize_corpus(tokenizer, texts)
    x = with_position_ids(causal_lm, x)
    sampler = causal_lm.sampler
    keras.utils.set_random_seed(seed)
    causal_lm.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        weighted_metrics=[],
        sampler=sampler,
    )
    # `CausalLM.fit` would route the arrays through the preprocessor and a
    # tf.data/grain pipeline; Keras' own `fit` takes the arrays as they are.
    history = keras.Model.fit(
        causal_lm,
        x=x,
        y=y,
        sample_weight=sample_weight,
        batch_size=len(y),
        epochs=steps,
        shuffle=False,
        verbose=0,
    )
    causal_lm.compile(sampler=sampler)
    return [float(loss) for loss in history.history["loss"]]


def greedy_continuations(causal_lm, prompts=None, max_length=32):
    """Returns the generated continuations of prompts.

    Args:
        causal_lm: a `keras_hub.models.CausalLM` with a preprocessor,
            compiled with the sampler to use (e.g. `"greedy"`).
        prompts: list of strings, optional. Defaults to `prompts()`.
        max_length: int. The maximum length of prompt plus continuation, in
            tokens.

    Returns:
        A list of strings: each prompt's continuation, prompt stripped.
    """
    prompts = data_lib.prompts() if prompts is None else list(prompts)
    # Not `strip_prompt=True`: some tasks' `generate()` (e.g. Phi-3's) lack
    # the argument.
    outputs = causal_lm.generate(prompts, max_length=max_length)
    return [
        output[len(prompt) :] if output.startswith(prompt) else output
        for prompt, output in zip(prompts, outputs)
    ]


def distinct_continuations(causal_lm, prompts=None, max_length=32):
    """Counts the distinct continuations of prompts.

    A model whose output ignores the prompt gives 1.

    Args:
        causal_lm: a `keras_hub.models.CausalLM` with a preprocessor.
        prompts: list of strings, optional. Defaults to `prompts()`.
        max_length: int. The maximum length of prompt plus continuation, in
            tokens.

    Returns:
        The number of distinct continuations, an int.
    """
    return len(set(greedy_continuations(causal_lm, prompts, max_length)))


def greedy_reference(causal_lm, prompt, max_length=32):
    """Greedy decoding by full forward passes, without a KV cache.

    A reference for serving checks that does not rely on the task's cached
    `generate()`: KerasHub's GPT-NeoX applies RoPE at the wrong offset in
    cached decoding, so its `generate()` differs from this reference once
    the model is fine-tuned. Every step runs the model on a fixed-shape,
    right-padded input of `max_length` tokens.

    Args:
        causal_lm: a `keras_hub.models.CausalLM` with a preprocessor.
        prompt: string.
        max_length: int. The maximum length of start token, prompt and
            continuation, in tokens.

    Returns:
        A list of token ids: the start token (if the family has one), the
        prompt tokens and the greedy continuation, which ends with an end
        token unless `max_length` was reached first.
    """
    tokenizer = causal_lm.preprocessor.tokenizer
    start = getattr(tokenizer, "start_token_id", None)
    stop_ids = {tokenizer.end_token_id}
    if getattr(tokenizer, "end_token2_id", None) is not None:
        stop_ids.add(tokenizer.end_token2_id)
    ids = [start] if start is not None else []
    ids += [int(i) for i in np.asarray(tokenizer.tokenize(prompt))]
    token_ids = np.full((1, max_length), tokenizer.pad_token_id or 0, "int32")
    padding_mask = np.zeros((1, max_length), dtype=bool)
    while len(ids) < max_length:
        token_ids[0, : len(ids)] = ids
        padding_mask[0, : len(ids)] = True
        logits = causal_lm(
            with_position_ids(
                causal_lm,
                {"token_ids": token_ids, "padding_mask": padding_mask},
            )
        )
        ids.append(int(np.argmax(np.asarray(logits)[0, len(ids) - 1])))
        if ids[-1] in stop_ids:
            break
    return ids
