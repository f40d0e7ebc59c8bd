"""A model's forward pass compiled once, for references that call it often.

Greedy decoding by the forward pass (`reference.greedy_batch(...,
name="forward_pass")`, the reference of models whose cached `generate()`
is not their forward pass) runs the whole sequence once per new token, and
teacher-forced log-probabilities (`reference.teacher_forced_logprobs`)
run it once per prompt. Called eagerly, every op of every layer dispatches
on its own, and compiles on its own for each new input length (Qwen 3.5's
chunked delta rule alone is hundreds of ops a step; a tiny model's three
prompts cost about 25 s of op compiles on a small CPU host); compiled, one
call is one XLA call on the same variables. The computation is the model's
own `call` (through `stateless_call`), so the reference does not change,
only its cost: one compile per input shape, then milliseconds a call.

Image references (greedy decoding by the forward pass where `generate()`
differs from it on images, at export and in the serving checks) take the
preprocessor's whole input dict (`argmax_at`, `logprobs_of`): eagerly, one
vision family's serving checks cost ~1,900 op compiles, and on a TPU each
small compile costs far more than on a CPU host.
"""

import json
import weakref

# Structure -> (compiled forward, the model it traces). Models of one
# structure (the fine-tuned model, its exported and reloaded copy) share
# one compile: only the variables' values differ, and those are arguments.
_COMPILED = {}


# Every call is padded to a multiple of `ROWS` rows and at least
# `MIN_LENGTH` positions, so that a process's references (the serving
# prompts, default sampling, golden outputs) share one compiled shape: on a
# hybrid model one compile costs more than all its steps.
ROWS = 16
MIN_LENGTH = 128


def last_position_argmax(
    causal_lm, token_ids, padding_mask, last_positions, make_inputs
):
    """Each row's greedy next token after `last_positions`, one XLA call.

    Rows are padded with copies of the first row, and positions with masked
    zeros after the last (causal layers never let later positions change
    earlier ones), up to the shared bucket.

    Args:
        causal_lm: a KerasHub `CausalLM`.
        token_ids: int `[B, T]`.
        padding_mask: bool `[B, T]`.
        last_positions: int `[B]`: the position whose logits pick each row's
            next token.
        make_inputs: `(causal_lm, token_ids, padding_mask) -> inputs`, the
            model's input dict (with `position_ids` where it takes them).

    Returns:
        A list of `B` ints.

    Example:

    ```python
    ids = np.array([[1, 5, 9, 0]], "int32")
    last_position_argmax(causal_lm, ids, ids > 0, [2], reference._inputs)
    ```
    """
    import numpy as np

    rows = np.shape(token_ids)[0]
    ids, mask = _bucketed(token_ids, padding_mask)
    last = np.full(ids.shape[0], int(last_positions[0]), dtype="int32")
    last[:rows] = last_positions
    tokens = _compiled(causal_lm, "argmax")(
        *_variables(causal_lm), make_inputs(causal_lm, ids, mask), last
    )
    return [int(t) for t in np.asarray(tokens)[:rows]]


def logprobs(causal_lm, token_ids, padding_mask, make_inputs):
    """Each row's log-softmax over the vocabulary at every position.

    Padded as `last_position_argmax` pads, so calls of different lengths
    (up to `MIN_LENGTH`) and up to `ROWS` rows share one compile.

    Args:
        causal_lm, make_inputs: as `last_position_argmax`.
        token_ids: int `[B, T]`.
        padding_mask: bool `[B, T]`.

    Returns:
        float32 numpy array `[B, T, vocab]`.
    """
    import numpy as np

    rows, length = np.shape(token_ids)
    ids, mask = _bucketed(token_ids, padding_mask)
    out = _compiled(causal_lm, "logprobs")(
        *_variables(causal_lm), make_inputs(causal_lm, ids, mask)
    )
    return np.asarray(out)[:rows, :length]


def compilable(causal_lm):
    """Whether references may run `causal_lm` compiled: a Keras model none
    of whose layers runs quantized (Keras sets a layer's
    `quantization_mode`: int8, int4, gptq, float8; its int8 layers round
    activations per shape, see `reference.teacher_forced_logprobs_batch`).
    Anything else that computes a model's logits when called (a wrapper
    that drops a model's image inputs, say) is called eagerly."""
    import keras

    if not isinstance(causal_lm, keras.Model):
        return False
    return not any(
        getattr(layer, "quantization_mode", None)
        for layer in causal_lm._flatten_layers(include_self=False)
    )


def argmax_at(causal_lm, inputs, positions):
    """Greedy next tokens of a model's own input dict, one XLA call.

    For inputs `last_position_argmax` cannot build from token ids alone
    (images and their placement, as the preprocessor writes them): the
    dict goes in as it is, so each new set of input shapes compiles once.
    Keep shapes fixed across calls (pad to one length) to reuse it. For
    models that are `compilable`.

    Args:
        causal_lm: a KerasHub `CausalLM`.
        inputs: the backbone's input dict, arrays with a batch axis.
        positions: int `[B]`: the position whose logits pick each row's
            next token.

    Returns:
        A list of `B` ints.

    Example:

    ```python
    x = causal_lm.preprocessor.generate_preprocess(
        {"prompts": ["<img> shows"], "images": [[image]]}, sequence_length=64
    )
    x = {k: v for k, v in x.items() if k in set(causal_lm.backbone.input)}
    argmax_at(causal_lm, x, [int(x["padding_mask"][0].sum()) - 1])
    ```
    """
    import numpy as np

    tokens = _compiled(causal_lm, "argmax")(
        *_variables(causal_lm), _as_arrays(inputs),
        np.asarray(positions, dtype="int32"),
    )
    return [int(t) for t in np.asarray(tokens)]


def logprobs_of(causal_lm, inputs):
    """Each position's log-softmax over the vocabulary for a model's own
    input dict (as `argmax_at` takes it), one XLA call.

    Args:
        causal_lm: a KerasHub `CausalLM`.
        inputs: the backbone's input dict, arrays with a batch axis.

    Returns:
        float32 numpy array `[B, T, vocab]`.
    """
    import numpy as np

    out = _compiled(causal_lm, "logprobs")(
        *_variables(causal_lm), _as_arrays(inputs)
    )
    return np.asarray(out)


def _as_arrays(inputs):
    # Preprocessors may hand back TensorFlow tensors; JAX takes numpy.
    import numpy as np

    return {name: np.asarray(value) for name, value in inputs.items()}


def _bucketed(token_ids, padding_mask):
    """Inputs padded to the shared bucket: rows with copies of the first
    row, positions with masked zeros after the last (causal layers never
    let later positions change earlier ones)."""
    import numpy as np

    rows, length = np.shape(token_ids)
    bucket = (-(-rows // ROWS) * ROWS, max(MIN_LENGTH, length))
    ids = np.zeros(bucket, dtype="int32")
    mask = np.zeros(bucket, dtype="bool")
    ids[:rows, :length] = token_ids
    mask[:rows, :length] = padding_mask
    ids[rows:], mask[rows:] = ids[0], mask[0]
    return ids, mask


def _variables(causal_lm):
    return (
        [v.value for v in causal_lm.trainable_variables],
        [v.value for v in causal_lm.non_trainable_variables],
    )


def _compiled(causal_lm, output):
    """The compiled forward of `causal_lm`'s structure returning `output`
    ("argmax" or "logprobs")."""
    key = (output, _structure(causal_lm))
    forward, traced = _COMPILED.get(key, (None, lambda: None))
    if traced() is None:
        # The model is held weakly: the cache must not keep it alive. Once
        # it is gone, the next model of its structure traces its own.
        traced = weakref.ref(causal_lm)
        forward = _compile(traced, output)
        _COMPILED[key] = (forward, traced)
    return forward


def _structure(causal_lm):
    """What the traced computation depends on besides variable values: the
    classes, the backbone's configuration and every variable's shape and
    dtype in order (LoRA or quantization change these). Names are left out:
    Keras numbers a second instance's layers (`_1`) without changing what
    they compute."""
    backbone = causal_lm.backbone
    config = dict(backbone.get_config())
    config.pop("name", None)
    config = json.dumps(config, sort_keys=True, default=repr)
    variables = tuple(
        (tuple(v.shape), str(v.dtype), v.trainable)
        for v in causal_lm.variables
    )
    return type(causal_lm), type(backbone), config, variables


def _compile(model_ref, output):
    import jax
    import jax.numpy as jnp

    def argmax(trainable, non_trainable, inputs, last_positions):
        logits, _ = model_ref().stateless_call(
            trainable, non_trainable, inputs
        )
        picked = jnp.take_along_axis(
            logits, last_positions[:, None, None], axis=1
        )[:, 0]
        return jnp.argmax(picked, axis=-1)

    def logprobs(trainable, non_trainable, inputs):
        logits, _ = model_ref().stateless_call(
            trainable, non_trainable, inputs
        )
        return jax.nn.log_softmax(logits.astype("float32"), axis=-1)

    return jax.jit({"argmax": argmax, "logprobs": logprobs}[output])
