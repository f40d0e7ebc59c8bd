"""Keras-side reference outputs: what `CausalLM.generate()` produces.

Export records these as golden outputs, `verify` replays them, and tests
compare vLLM against them. `greedy_continuation` runs one prompt through the
model's own compiled generate function; `greedy_batch` runs many prompts in
one compiled call (export and `verify` use it: one compile instead of one
per prompt length), padded on the right to one shape. Causal attention keeps
a row's padding invisible to its real positions, and a test checks the
batched tokens equal the per-prompt ones. `greedy_by_forward_pass` is the
reference for a model whose cached `generate()` differs from its own forward
pass (KerasHub's GPT-NeoX).
"""

import weakref

import numpy as np

from keras_vllm.hub import compiled_forward

# Each model's greedy generate function (see `_generate_rows`).
_GREEDY_FUNCTIONS = weakref.WeakKeyDictionary()


def prompt_token_ids(causal_lm, text):
    """Tokenizes a prompt the way `causal_lm.generate(text)` does.

    The start token is prepended when the preprocessor adds one; no end
    token is appended (generation continues the prompt).
    """
    preprocessor = causal_lm.preprocessor
    tokenizer = preprocessor.tokenizer
    ids = [int(i) for i in np.asarray(tokenizer.tokenize(text)).reshape(-1)]
    start = getattr(tokenizer, "start_token_id", None)
    if getattr(preprocessor, "add_start_token", False) and start is not None:
        ids = [int(start)] + ids
    return ids


def default_stop_token_ids(tokenizer):
    """The stop tokens `generate(stop_token_ids="auto")` uses."""
    stops = []
    for attr in ("end_token_id", "end_token2_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None and int(value) not in stops:
            stops.append(int(value))
    return stops


def pads_with_stop_token(tokenizer, stop_token_ids):
    """Whether `generate()` stops before its first token on this tokenizer.

    keras-hub's preprocessor pads a prompt with the tokenizer's
    `pad_token_id` up to the generation length, and its sampler stops a row
    as soon as a position after the prompt holds a stop id, including the
    padding not yet generated. A tokenizer whose pad id is also an end
    token (a vocabulary trained with its special tokens first, where
    keras-hub pads with id 0) makes `generate()` return the prompt alone.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad is not None and int(pad) in set(stop_token_ids or ())


def greedy_continuation(causal_lm, token_ids, max_new_tokens, stop_token_ids):
    """Greedy new token ids after `token_ids`, as `generate()` computes them.

    Args:
        causal_lm: a KerasHub `CausalLM` (its sampler is temporarily set to
            greedy and restored afterwards).
        token_ids: the prompt as a list of ints (start token included).
        max_new_tokens: how many tokens to generate at most.
        stop_token_ids: ids that end generation (included in the output).

    Returns:
        A list of ints: the generated ids, ending at the first stop token.
    """
    # One row of the batched reference: the same compiled call and trim.
    return greedy_batch(causal_lm, [token_ids], max_new_tokens, stop_token_ids)[0]


def greedy_by_forward_pass(
    causal_lm, token_ids, max_new_tokens, stop_token_ids
):
    """Greedy new token ids after `token_ids`, one full forward pass a token.

    The reference for models whose cached `generate()` is not their
    forward pass (KerasHub's GPT-NeoX caches pre-RoPE keys and rotates
    decode queries at position 0): each step re-runs the whole sequence
    through `causal_lm(...)`, with no KV cache, and takes the argmax at the
    last real position. Inputs are right-padded to a fixed length (causal
    attention makes the padding invisible to real positions), so all steps
    of a prompt share one input shape. Cost is quadratic in the length;
    meant for tiny test models.

    Each step is one compiled call of the model's forward pass
    (`compiled_forward`): the same computation as calling the model.

    Args and return value as `greedy_continuation`.
    """
    ids = [int(i) for i in token_ids]
    length = len(ids) + max_new_tokens
    # Round the shape up so prompts of similar lengths share compilations.
    length = -(-length // 64) * 64
    padded = np.zeros((1, length), dtype="int32")
    mask = np.zeros((1, length), dtype="bool")
    result = []
    for _ in range(max_new_tokens):
        padded[0, : len(ids)] = ids
        mask[0, : len(ids)] = True
        (token,) = compiled_forward.last_position_argmax(
            causal_lm, padded, mask, [len(ids) - 1], _inputs
        )
        ids.append(token)
        result.append(token)
        if stop_token_ids and token in stop_token_ids:
            break
    return result


def _trim(row, max_new_tokens, stop_token_ids):
    """A row's new tokens up to `max_new_tokens`, ending at a stop token."""
    result = []
    for token in row[:max_new_tokens]:
        result.append(int(token))
        if stop_token_ids and token in stop_token_ids:
            break
    return result


def greedy_batch(
    causal_lm, prompts, max_new_tokens, stop_token_ids, name="generate"
):
    """Greedy new token ids for many prompts in one compiled call.

    All prompts are right-padded to one `[len(prompts), longest +
    max_new_tokens]` shape, so the model compiles once, where one
    `greedy_continuation` per prompt compiles once per prompt length. A row
    whose prompt is shorter keeps generating past `max_new_tokens` (the
    shape is shared); those tokens are dropped, so each row is what the
    per-prompt reference returns.

    Args:
        causal_lm: a KerasHub `CausalLM`.
        prompts: a list of prompts, each a list of ints (start token
            included).
        max_new_tokens: how many tokens to generate at most per prompt.
        stop_token_ids: ids that end a row (included in its output).
        name: the reference, as `greedy_by` takes it.

    Returns:
        A list with one list of new ids per prompt.

    Example:

    >>> greedy_batch(causal_lm, [[1, 5, 9], [1, 7]], 8, [2])  # doctest: +SKIP
    """
    greedy_by(name)  # An unknown reference name fails here, not later.
    if not prompts:
        return []
    lengths = [len(ids) for ids in prompts]
    length = max(lengths) + max_new_tokens
    if name == "forward_pass":
        # Same rounding as `greedy_by_forward_pass`: one shape per 64.
        length = -(-length // 64) * 64
    # Positions after a prompt hold a filler until generated. keras-hub's
    # sampler stops a row once any unmasked position holds a stop id, so
    # the filler must not be one: with 0 (what keras-hub pads with) among
    # the stop ids, `generate()` would stop before its first token (see
    # `pads_with_stop_token`).
    filler = next(i for i in range(len(stop_token_ids or ()) + 1)
                  if i not in (stop_token_ids or ()))
    padded = np.full((len(prompts), length), filler, dtype="int32")
    mask = np.zeros((len(prompts), length), dtype="bool")
    for row, ids in enumerate(prompts):
        padded[row, : len(ids)] = ids
        mask[row, : len(ids)] = True
    if name == "forward_pass":
        rows = _forward_pass_rows(
            causal_lm, padded, mask, lengths, max_new_tokens
        )
    else:
        rows = _generate_rows(causal_lm, padded, mask, lengths, stop_token_ids)
    return [_trim(row, max_new_tokens, stop_token_ids) for row in rows]


def _generate_rows(causal_lm, padded, mask, lengths, stop_token_ids):
    import keras_hub

    sampler, function = causal_lm.sampler, causal_lm.generate_function
    causal_lm.sampler = keras_hub.samplers.GreedySampler()
    causal_lm.generate_function = _GREEDY_FUNCTIONS.get(causal_lm)
    try:
        generate = causal_lm.make_generate_function()
        # Kept for the next call: keras-hub's JAX generate function is one
        # `jax.jit` that takes the weights as arguments and traces the
        # sampler set when a new shape first compiles (greedy here, always).
        # A new function per call compiled every call again (seconds each
        # on CPU: export's goldens, `verify`, the tests' references).
        _GREEDY_FUNCTIONS[causal_lm] = generate
        stops = tuple(stop_token_ids) if stop_token_ids else None
        outputs = generate(
            {"token_ids": padded, "padding_mask": mask}, stop_token_ids=stops
        )
    finally:
        causal_lm.sampler, causal_lm.generate_function = sampler, function
    out_ids = np.asarray(outputs["token_ids"])
    out_mask = np.asarray(outputs["padding_mask"])
    rows = []
    for row, start in enumerate(lengths):
        tokens = []
        for token, keep in zip(
            out_ids[row, start:].tolist(), out_mask[row, start:].tolist()
        ):
            if not keep:
                break
            tokens.append(int(token))
        rows.append(tokens)
    return rows


def _forward_pass_rows(causal_lm, padded, mask, lengths, max_new_tokens):
    positions = list(lengths)
    rows = [[] for _ in lengths]
    last = padded.shape[1]
    for _ in range(max_new_tokens):
        # One compiled call a step (eagerly, every op dispatches alone).
        tokens = compiled_forward.last_position_argmax(
            causal_lm, padded, mask, [p - 1 for p in positions], _inputs
        )
        for row, token in enumerate(tokens):
            rows[row].append(int(token))
            if positions[row] < last:
                padded[row, positions[row]] = token
                mask[row, positions[row]] = True
                positions[row] += 1
    return rows


def greedy_by(name):
    """The greedy reference a manifest's `golden_reference` names.

    Args:
        name: `"generate"` (`greedy_continuation`) or `"forward_pass"`
            (`greedy_by_forward_pass`).
    """
    return {
        "generate": greedy_continuation,
        "forward_pass": greedy_by_forward_pass,
    }[name]


def teacher_forced_logprobs(causal_lm, token_ids):
    """Log-probabilities of each next token from one full forward pass.

    Returns:
        float32 array `[len(token_ids), vocab]`: row i is the distribution
        over the token after position i.
    """
    return teacher_forced_logprobs_batch(causal_lm, [token_ids])[0]


def teacher_forced_logprobs_batch(causal_lm, prompts):
    """`teacher_forced_logprobs` of each prompt (lists of ints).

    Float models run one compiled forward pass for all prompts, padded on
    the right to a shared shape (`compiled_forward.logprobs`: causal
    attention keeps the padding invisible, and calls of other lengths reuse
    the compile). Models with quantized layers (and callables that are not
    Keras models) run one eager, unpadded pass per prompt: Keras' int8
    layers round each token's activations to its own abs-max scale, and
    another summation order (another shape) can move a value across a
    rounding step (seen: 7e-3 on a tiny Llama).

    Returns:
        A list of float32 arrays `[len(prompt), vocab]`.
    """
    from keras import ops

    if compiled_forward.compilable(causal_lm):
        length = max(len(ids) for ids in prompts)
        padded = np.zeros((len(prompts), length), dtype="int32")
        mask = np.zeros((len(prompts), length), dtype="bool")
        for row, ids in enumerate(prompts):
            padded[row, : len(ids)] = ids
            mask[row, : len(ids)] = True
        rows = compiled_forward.logprobs(causal_lm, padded, mask, _inputs)
        return [rows[row, : len(ids)] for row, ids in enumerate(prompts)]
    outputs = []
    for token_ids in prompts:
        ids = np.asarray([token_ids], dtype="int32")
        logits = causal_lm(
            _inputs(causal_lm, ids, np.ones_like(ids, dtype="bool"))
        )
        logits = ops.cast(logits[0], "float32")
        outputs.append(np.asarray(ops.log_softmax(logits, axis=-1)))
    return outputs


def _inputs(causal_lm, token_ids, padding_mask):
    """A forward pass's inputs; with `position_ids` 0, 1, ... per row when
    the backbone takes them (the positions vLLM serves these tokens at)."""
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    # A stand-in for a model (a callable with a preprocessor) adds its own.
    backbone = getattr(causal_lm, "backbone", None)
    names = [t.name.split(":")[0] for t in getattr(backbone, "inputs", [])]
    if "position_ids" in names:
        shape = np.shape(token_ids)
        inputs["position_ids"] = np.array(
            np.broadcast_to(np.arange(shape[1], dtype="int32"), shape)
        )
    return inputs
