"""bfloat16 serving measured against Keras in bfloat16.

A fine-tuned float32 model is exported once; Keras rebuilds it in bfloat16
(`load_causal_lm(path, dtype="bfloat16")`) and an engine serves the same
artifact in bfloat16 (`from_export(path, dtype="bfloat16")`). Two bfloat16
programs that group their sums differently may pick either of two tokens
whose logits bfloat16 cannot tell apart, so a prompt whose greedy tokens
diverge is judged by Keras' own logit margin at the first diverging
position (`near_tie`); the engine's logprob gap there is recorded beside it.

The TPU tier calls this (`tests/tpu/test_tpu_bfloat16.py`); it runs
unchanged on a CPU host.
"""

import math

import numpy as np

from helpers import engine_shapes
from helpers import serving_checks
from keras_vllm import testing
from keras_vllm.hub import reference

NEW_TOKENS = serving_checks.NEW_TOKENS
# Logprobs returned per generated token: vLLM's default `max_logprobs`.
# Wide enough that Keras' token is among them wherever it is a near-tie.
TOP_LOGPROBS = 20
# A divergence is a near-tie when Keras' top-1 logit is at most this many
# bfloat16 ulps (at the larger of the two logits' magnitudes) above the
# engine's token: each side rounds its logits to bfloat16 (half an ulp)
# from hidden states rounded along another path, so each may land about an
# ulp from the exact value, in opposite directions.
NEAR_TIE_ULPS = 2


def bf16_ulp(value):
    """The spacing of bfloat16 numbers at `value`'s magnitude: 8
    significant bits, so 2**(e - 7) in [2**e, 2**(e + 1))."""
    value = abs(float(value))
    if value == 0.0 or not math.isfinite(value):
        return 2.0 ** -133  # the smallest subnormal: only equality is a tie
    return 2.0 ** (math.floor(math.log2(value)) - 7)


def near_tie(margin, ulp):
    """The rule the test asserts for every divergence."""
    return margin is not None and margin <= NEAR_TIE_ULPS * ulp


def start(causal_lm, directory, **engine_kwargs):
    """Exports `causal_lm` (float32) as `serving_checks.start_engine` does.

    Returns:
        `(keras, engine)`: Keras' model rebuilt from the artifact in
        bfloat16, and an engine serving the artifact in bfloat16 (sized by
        `engine_shapes.ENGINE_KWARGS` unless `engine_kwargs` say otherwise).
    """
    import keras_vllm

    path = causal_lm.export_vllm(directory, max_sequence_length=256,
                                 golden_prompts=testing.prompts()[:2])
    keras = keras_vllm.load_causal_lm(path, dtype="bfloat16", verbose=False)
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, dtype="bfloat16", **(engine_shapes.ENGINE_KWARGS | engine_kwargs)
    )
    return keras, engine


def first_divergence(want, got):
    """The first position where `got` differs from `want`, or None.

    Both end at the same stop tokens or at `NEW_TOKENS`: equal prefixes of
    different lengths mean one side ended otherwise, diverging there."""
    for position, (a, b) in enumerate(zip(want, got)):
        if a != b:
            return position
    return None if len(want) == len(got) else min(len(want), len(got))


def last_logits(causal_lm, sequences):
    """Keras' logits after the last token of each sequence, as float32.

    One compiled forward pass for all (right-padded; causal attention keeps
    the padding invisible), compiled as the references are: eager bfloat16
    ops round every intermediate, another computation than XLA's fusions.

    Returns:
        float32 `[len(sequences), vocab]`, the model's own values (bfloat16
        logits are exact in float32).
    """
    import jax

    length = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), length), dtype="int32")
    mask = np.zeros((len(sequences), length), dtype="bool")
    for row, s in enumerate(sequences):
        ids[row, : len(s)], mask[row, : len(s)] = s, True
    last = np.array([len(s) - 1 for s in sequences], dtype="int32")

    def forward(trainable, non_trainable, inputs, last):
        logits, _ = causal_lm.stateless_call(trainable, non_trainable, inputs)
        return logits[np.arange(len(sequences)), last].astype("float32")

    out = jax.jit(forward)(
        [v.value for v in causal_lm.trainable_variables],
        [v.value for v in causal_lm.non_trainable_variables],
        reference._inputs(causal_lm, ids, mask), last,
    )
    return np.asarray(out)


def engine_gap(logprobs, chosen, other):
    """`(engine logprob of chosen - of other, exact)`; where `other` is
    not among the returned logprobs, a lower bound and False."""
    values = {int(t): float(lp.logprob) for t, lp in logprobs.items()}
    if other in values:
        return values[chosen] - values[other], True
    return values[chosen] - min(values.values()), False


def divergences(causal_lm, rows):
    """Explains each first divergence by Keras' margin there.

    Args:
        causal_lm: the Keras bfloat16 model.
        rows: `(prompt, prompt_ids, want, got, logprobs)` per diverging
            prompt: Keras' and the engine's new tokens, and the engine's
            logprobs per new token (or None).

    Returns:
        One dict per row: the report's `divergences`.
    """
    entries = []
    for prompt, prompt_ids, want, got, _ in rows:
        p = first_divergence(want, got)
        entries.append({
            "prompt": prompt, "position": p,
            "keras_token": want[p] if p < len(want) else None,
            "engine_token": got[p] if p < len(got) else None,
            "keras_margin": None, "bf16_ulp": None, "engine_gap": None,
            "explained": False,
        })
    # Only where both sides chose a token is there a margin; a side that
    # ended without a stop token stays unexplained.
    chosen = [i for i, e in enumerate(entries)
              if None not in (e["keras_token"], e["engine_token"])]
    if not chosen:  # nothing to compile where every prompt is equal
        return entries
    logits = last_logits(causal_lm, [
        list(rows[i][1]) + list(rows[i][2][: entries[i]["position"]])
        for i in chosen
    ])
    for i, row in zip(chosen, logits):
        e, logprobs = entries[i], rows[i][4]
        top, theirs = float(row.max()), float(row[e["engine_token"]])
        # How far Keras' forward pass prefers its best token over the
        # engine's (0 where it picks the engine's token itself).
        e["keras_margin"], e["keras_top"] = top - theirs, int(row.argmax())
        e["bf16_ulp"] = bf16_ulp(max(abs(top), abs(theirs)))
        e["explained"] = near_tie(e["keras_margin"], e["bf16_ulp"])
        if logprobs is not None:
            e["engine_gap"], exact = engine_gap(
                logprobs[e["position"]], e["engine_token"], e["keras_token"]
            )
            if not exact:
                e["engine_gap_is_lower_bound"] = True
    return entries


def measure(engine, causal_lm, greedy=reference.greedy_continuation):
    """Greedy tokens and prompt logprobs of `engine` against `causal_lm`.

    Both generate up to `NEW_TOKENS` for each serving prompt, stopping at
    the model's own stop tokens (`generate()`'s default).

    Args:
        greedy: the family's Keras reference (`family_serving`).

    Returns:
        The report's `prompts_equal`, `prompts`, `divergences` and
        `worst_logprob_gap` (teacher-forced, `check_prompt_logprobs`).
    """
    from vllm import SamplingParams

    prompts = serving_checks.serving_prompts()
    ids = [reference.prompt_token_ids(causal_lm, p) for p in prompts]
    stops = reference.default_stop_token_ids(causal_lm.preprocessor.tokenizer)
    expected = serving_checks.expected_batch(
        greedy, causal_lm, ids, NEW_TOKENS, stops
    )
    # The engine stops at exactly Keras' stop tokens (`ignore_eos` drops
    # vLLM's end-of-sequence set, which another config could state).
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
        stop_token_ids=stops, logprobs=TOP_LOGPROBS,
    )
    outputs = engine.generate(prompts, params, use_tqdm=False)
    rows = []
    for prompt, prompt_ids, out, want in zip(prompts, ids, outputs, expected):
        assert out.prompt_token_ids == prompt_ids, prompt
        got = list(out.outputs[0].token_ids)
        if got != list(want):
            rows.append((prompt, prompt_ids, list(want), got,
                         out.outputs[0].logprobs))
    return {
        "prompts_equal": len(prompts) - len(rows),
        "prompts": len(prompts),
        "divergences": divergences(causal_lm, rows),
        "worst_logprob_gap": float(serving_checks.check_prompt_logprobs(
            engine, causal_lm, atol=float("inf")
        )),
    }
