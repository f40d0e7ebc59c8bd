"""The compiled forward pass behind greedy decoding by the forward pass
(`keras_vllm.hub.compiled_forward`) computes what calling the model does,
on the variables it is given: models of one structure share one compile,
each with its own weights."""

import numpy as np

from keras_vllm import testing
from keras_vllm.hub import compiled_forward
from keras_vllm.hub import reference


def _eager_argmax(causal_lm, ids, mask, last):
    logits = np.asarray(causal_lm(reference._inputs(causal_lm, ids, mask)))
    return [int(np.argmax(logits[row, p])) for row, p in enumerate(last)]


def test_compiled_argmax_is_the_models_own_on_its_own_weights(monkeypatch):
    # An empty cache: a model of this structure built by an earlier test in
    # this process may still be alive and would own the compile.
    monkeypatch.setattr(compiled_forward, "_COMPILED", {})
    first = testing.build_tiny_causal_lm("gpt_neo_x", seed=0)
    second = testing.build_tiny_causal_lm("gpt_neo_x", seed=1)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 60, size=(3, 20)).astype("int32")
    mask = np.ones_like(ids, dtype=bool)
    mask[1, 12:] = False  # a right-padded row
    last = [19, 11, 5]
    want_first = _eager_argmax(first, ids, mask, last)
    want_second = _eager_argmax(second, ids, mask, last)
    assert want_first != want_second, "the two models agree: no check"
    got_first = compiled_forward.last_position_argmax(
        first, ids, mask, last, reference._inputs
    )
    got_second = compiled_forward.last_position_argmax(
        second, ids, mask, last, reference._inputs
    )
    assert got_first == want_first
    assert got_second == want_second
    # One compile for both: the second model ran the first one's trace.
    key = compiled_forward._structure(first)
    assert key == compiled_forward._structure(second)
    assert compiled_forward._COMPILED["argmax", key][1]() is first


def test_compiled_logprobs_are_the_models_own(monkeypatch):
    """Teacher-forced log-probabilities, compiled and padded to the shared
    bucket, equal one eager forward pass per prompt (the float model's;
    `reference.teacher_forced_logprobs` keeps quantized models eager).
    About 10 s: two compiles of a tiny model."""
    monkeypatch.setattr(compiled_forward, "_COMPILED", {})
    model = testing.build_tiny_causal_lm("llama", seed=0)
    prompts = [[1, 7, 9, 30, 12], [1, 40, 41, 42, 43, 44, 45, 46, 47]]
    got = reference.teacher_forced_logprobs_batch(model, prompts)
    for ids, rows in zip(prompts, got):
        x = np.asarray([ids], dtype="int32")
        logits = np.asarray(model(reference._inputs(model, x, x > 0)))[0]
        want = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        assert rows.shape == want.shape
        np.testing.assert_allclose(rows, want, atol=1e-5)
    # One compile for both lengths.
    assert [k[0] for k in compiled_forward._COMPILED] == ["logprobs"]


def test_a_models_own_input_dict_runs_as_it_is(monkeypatch):
    """`argmax_at` / `logprobs_of` take the backbone's input dict unbuilt
    (image references hand over the preprocessor's, images included) and
    compute what one eager call does. About 5 s: two compiles of a tiny
    model."""
    monkeypatch.setattr(compiled_forward, "_COMPILED", {})
    model = testing.build_tiny_causal_lm("gpt_neo_x", seed=0)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 60, size=(2, 16)).astype("int32")
    mask = np.ones_like(ids, dtype=bool)
    mask[0, 9:] = False
    inputs = reference._inputs(model, ids, mask)
    last = [8, 15]
    assert compiled_forward.argmax_at(model, inputs, last) == _eager_argmax(
        model, ids, mask, last
    )
    logits = np.asarray(model(inputs)).astype("float64")
    top = logits.max(-1, keepdims=True)
    want = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    got = compiled_forward.logprobs_of(model, inputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
