"""Keras-side reference outputs: what `CausalLM.generate()` produces.

Export records these as golden outputs, `verify` replays them, and tests
compare vLLM against them. Generation runs one prompt at a time through the
model's own compiled generate function, so no padding between prompts can
change a result. `greedy_by_forward_pass` is the reference for a model whose
cached `generate()` differs from its own forward pass (KerasHub's GPT-NeoX).
"""

import numpy as np


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
    import keras_hub

    length = len(token_ids) + max_new_tokens
    padded = np.zeros((1, length), dtype="int32")
    padded[0, : len(token_ids)] = token_ids
    mask = np.zeros((1, length), dtype="bool")
    mask[0, : len(token_ids)] = True

    sampler, function = causal_lm.sampler, causal_lm.generate_function
    causal_lm.sampler = keras_hub.samplers.GreedySampler()
    causal_lm.generate_function = None
    try:
        generate = causal_lm.make_generate_function()
        stops = tuple(stop_token_ids) if stop_token_ids else None
        outputs = generate(
            {"token_ids": padded, "padding_mask": mask}, stop_token_ids=stops
        )
    finally:
        causal_lm.sampler, causal_lm.generate_function = sampler, function

    out_ids = np.asarray(outputs["token_ids"])[0, len(token_ids) :]
    out_mask = np.asarray(outputs["padding_mask"])[0, len(token_ids) :]
    result = []
    for token, keep in zip(out_ids.tolist(), out_mask.tolist()):
        if not keep:
            break
        result.append(int(token))
        if stop_token_ids and token in stop_token_ids:
            break
    return result


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

    Args and return value as `greedy_continuation`.
    """
    from keras import ops

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
        logits = causal_lm({"token_ids": padded, "padding_mask": mask})
        token = int(ops.convert_to_numpy(ops.argmax(logits[0, len(ids) - 1])))
        ids.append(token)
        result.append(token)
        if stop_token_ids and token in stop_token_ids:
            break
    return result


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
    from keras import ops

    ids = np.asarray([token_ids], dtype="int32")
    logits = causal_lm(
        {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype="bool")}
    )
    logits = ops.cast(logits[0], "float32")
    return np.asarray(ops.log_softmax(logits, axis=-1))
