"""Checks shared by the per-family serving test modules.

Each module starts one engine (vLLM's default multiprocess mode, default
scheduling, sized by `engine_shapes`) on a fine-tuned tiny model's artifact
and compares it with `CausalLM.generate()` and with the full forward pass.
"""

import weakref

import numpy as np
import pytest

from helpers import engine_shapes
from keras_vllm import reference
from keras_vllm import testing

NEW_TOKENS = 32


def serving_prompts():
    """≥ 8 prompts of different lengths, some longer than a 16-token window."""
    corpus = testing.corpus()
    prompts = list(testing.prompts())
    prompts.append(corpus[0] + " " + corpus[1])
    prompts.append(" ".join(corpus[2:5]))
    prompts.append("a")
    return prompts


# Keras' expected continuations, per process: the single-device and the
# tensor-parallel modules check the same session-wide models on the same
# prompts, and each expectation costs a `generate()` compile.
_EXPECTED = weakref.WeakKeyDictionary()


def expected_tokens(greedy, causal_lm, ids, new_tokens, stops):
    """`greedy(causal_lm, ids, new_tokens, stops)`, computed once."""
    # Keyed by the model object itself, held weakly: an `id()` is reused
    # once a module's model is freed, and another family's model then read
    # the first one's expectations (seen in CI: phi3 against an earlier
    # module's tokens).
    memo = _EXPECTED.setdefault(causal_lm, {})
    key = (greedy, tuple(ids), new_tokens, tuple(stops))
    if key not in memo:
        memo[key] = list(greedy(causal_lm, ids, new_tokens, stops))
    return memo[key]


def start_engine(causal_lm, directory, **engine_kwargs):
    """Exports `causal_lm` and starts an engine sized to the serving checks
    (`engine_shapes.ENGINE_KWARGS`, unless `engine_kwargs` say otherwise)."""
    import keras_vllm

    path = causal_lm.export_vllm(
        directory,
        max_sequence_length=256,
        golden_prompts=testing.prompts()[:2],
    )
    return keras_vllm.KerasVllmEngine.from_export(
        path, **(engine_shapes.ENGINE_KWARGS | engine_kwargs)
    )


def check_greedy_matches_generate(
    engine, causal_lm, greedy=reference.greedy_continuation
):
    """`greedy` computes the expected tokens (default: `generate()`'s)."""
    from vllm import SamplingParams

    prompts = serving_prompts()
    expected = []
    for text in prompts:
        ids = reference.prompt_token_ids(causal_lm, text)
        expected.append(expected_tokens(greedy, causal_lm, ids, NEW_TOKENS, []))
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    outputs = engine.generate(prompts, params)
    mismatches = []
    for text, out, want in zip(prompts, outputs, expected):
        assert out.prompt_token_ids == reference.prompt_token_ids(
            causal_lm, text
        )
        got = list(out.outputs[0].token_ids)
        if got != want:
            mismatches.append((text, want, got))
    assert not mismatches, mismatches
    assert len({tuple(w) for w in expected}) > 2, "outputs ignore the prompt"


def check_prompt_logprobs(engine, causal_lm, atol=1e-4):
    from vllm import SamplingParams

    prompts = serving_prompts()[-3:]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outputs = engine.generate(prompts, params)
    worst = 0.0
    for text, out in zip(prompts, outputs):
        ids = out.prompt_token_ids
        keras_logprobs = reference.teacher_forced_logprobs(causal_lm, ids)
        for i in range(1, len(ids)):
            served = out.prompt_logprobs[i][ids[i]].logprob
            worst = max(worst, abs(served - keras_logprobs[i - 1, ids[i]]))
    assert worst <= atol, worst
    return worst


def check_default_sampling_is_the_models(
    engine, causal_lm, greedy=reference.greedy_continuation
):
    """The exported model is greedy, so requests without sampling params are
    deterministic and equal greedy decoding."""
    prompts = testing.prompts()
    first = [list(o.outputs[0].token_ids) for o in engine.generate(prompts)]
    second = [list(o.outputs[0].token_ids) for o in engine.generate(prompts)]
    assert first == second
    for text, got in zip(prompts, first):
        ids = reference.prompt_token_ids(causal_lm, text)
        stops = reference.default_stop_token_ids(
            causal_lm.preprocessor.tokenizer
        )
        want = expected_tokens(greedy, causal_lm, ids, len(got), stops)
        assert got == want


def shutdown(engine):
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(["a"])
