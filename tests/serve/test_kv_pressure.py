"""Serving when the KV cache is shared, chunked and short.

One engine (vLLM's default multiprocess mode and async scheduling) on the
tiny Llama 3's artifact, sized so that the engine's paged-cache machinery
does its three jobs in one batch: requests that share a long prefix read
it from vLLM's prefix cache, a prompt longer than a step's token budget is
prefilled in chunks, and a KV cache of 16 blocks (512 tokens) cannot hold
the batch, so vLLM preempts a request and recomputes it later. Every
request must still generate what `generate()` does, token for token.

The preemption is the case tpu-inference 0.32.0 got wrong with async
scheduling (a returning request re-read a placeholder token; fixed by
`keras_vllm.serve.worker.resumed_tokens`): without the fix two requests of this
module's batch left `generate()`'s tokens partway.

A second engine serves the tiny Qwen 3.5 (three of four layers keep a
recurrent state per sequence in a vLLM state slot) with a block pool too
small for its 4 running sequences: vLLM preempts, frees the request's KV
blocks and state slot, and later recomputes it from its first token, so the
state must be rebuilt from scratch (never read from the slot it had, which
another request has rewritten since). Its prompts are also prefilled in
32-token chunks. Every request must decode what greedy decoding by Keras'
forward pass gives (the family's reference).
"""

import types

import pytest

pytest.importorskip("tpu_inference")

from helpers import serving_checks  # noqa: E402
from helpers import trained_models  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402

FAMILY = "llama3"
NEW_TOKENS = 24
PREFIX = 200
LONG = 300
ENGINE = {
    "max_model_len": 384,
    "max_num_seqs": 8,
    # A 300-token prompt takes five steps to prefill.
    "max_num_batched_tokens": 64,
    # 16 blocks of 32 tokens: less than the batch needs at once.
    "num_gpu_blocks_override": 16,
    # `get_metrics()` counts the preemptions.
    "disable_log_stats": False,
}


def _prompts(causal_lm):
    """Prompts sharing a 200-token prefix, and two 300-token prompts."""
    text = " ".join(testing.corpus())
    ids = reference.prompt_token_ids(causal_lm, text)
    assert len(ids) > 50
    long_ids = (ids * (LONG // len(ids) + 1))[:LONG]
    shared = [
        long_ids[:PREFIX] + reference.prompt_token_ids(causal_lm, p)[1:]
        for p in testing.prompts()
    ]
    return shared, [long_ids, long_ids[:LONG - 7] + long_ids[:7]]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import keras_vllm

    causal_lm = trained_models.trained(FAMILY)
    path = causal_lm.export_vllm(
        tmp_path_factory.mktemp("kv_pressure") / "artifact",
        max_sequence_length=ENGINE["max_model_len"],
        golden_prompts=[],
    )
    shared, long = _prompts(causal_lm)
    engine = keras_vllm.KerasVllmEngine.from_export(path, **ENGINE)
    yield types.SimpleNamespace(
        engine=engine, causal_lm=causal_lm, shared=shared, long=long
    )
    serving_checks.shutdown(engine)


def _metric(engine, name):
    values = [m.value for m in engine.llm.get_metrics() if m.name == name]
    assert values, f"vLLM reports no {name}"
    return sum(values)


def test_prefix_hits_chunks_and_preemption_keep_generate_tokens(served):
    from vllm import SamplingParams

    engine, causal_lm = served.engine, served.causal_lm
    prompts = served.shared + served.long
    want = serving_checks.expected_batch(
        reference.greedy_continuation, causal_lm, prompts, NEW_TOKENS
    )
    assert len({tuple(w) for w in want}) > 2, "outputs ignore the prompt"
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    # The first prompt alone puts the shared prefix in the cache.
    first = engine.generate([{"prompt_token_ids": prompts[0]}], params)
    assert list(first[0].outputs[0].token_ids) == want[0]
    preempted = _metric(engine, "vllm:num_preemptions")
    outputs = engine.generate(
        [{"prompt_token_ids": p} for p in prompts], params
    )
    got = [list(o.outputs[0].token_ids) for o in outputs]
    mismatches = [
        (i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w
    ]
    assert not mismatches, mismatches
    # What the batch exercised: cached prefixes (whole 32-token blocks of
    # the 200 shared tokens) and at least one preemption.
    for output in outputs[: len(served.shared)]:
        assert output.num_cached_tokens >= PREFIX // 32 * 32 - 32
    assert _metric(engine, "vllm:num_preemptions") > preempted


def test_chunked_prompt_logprobs_match_forward_pass(served):
    from vllm import SamplingParams

    ids = served.long[0]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    (output,) = served.engine.generate([{"prompt_token_ids": ids}], params)
    keras_logprobs = reference.teacher_forced_logprobs(served.causal_lm, ids)
    worst = max(
        abs(output.prompt_logprobs[i][ids[i]].logprob
            - keras_logprobs[i - 1, ids[i]])
        for i in range(1, len(ids))
    )
    assert worst <= 1e-4, worst


def test_returning_requests_get_the_schedulers_tokens():
    from keras_vllm.serve.worker import resumed_tokens

    placeholder = types.SimpleNamespace(output_token_ids=[7, 8, 0])
    in_batch = types.SimpleNamespace(output_token_ids=[5, 0])
    requests = {"back": placeholder, "stayed": in_batch}
    row = placeholder.output_token_ids
    cached = types.SimpleNamespace(
        req_ids=["back", "stayed"],
        num_output_tokens=[3, 2],
        # Only requests missing from the previous step are listed.
        all_token_ids={"back": [1, 2, 3, 7, 8, 9]},
    )
    assert resumed_tokens.restore_outputs(requests, cached) == ["back"]
    assert placeholder.output_token_ids == [7, 8, 9]
    assert row is placeholder.output_token_ids  # replaced in place
    assert in_batch.output_token_ids == [5, 0]  # its placeholder is swapped later
    # Nothing to restore: no outputs yet, or the tokens already agree.
    cached.num_output_tokens = [0, 2]
    assert resumed_tokens.restore_outputs(requests, cached) == []
    cached.num_output_tokens = [3, 2]
    assert resumed_tokens.restore_outputs(requests, cached) == []


HYBRID_FAMILY = "qwen3_5"
HYBRID_BLOCKS = 12
HYBRID_ENGINE = {
    "max_model_len": 128,
    # 4 state slots for the 9 prompts; 32-token steps chunk the prefills.
    "max_num_seqs": 4,
    "max_num_batched_tokens": 32,
    # Each running request holds one block per state layer group (3) and
    # its attention layer's KV blocks: 12 blocks cannot hold 4 prompts of
    # up to 99 tokens (67 + 32 new), so vLLM preempts.
    "num_gpu_blocks_override": HYBRID_BLOCKS,
    "disable_log_stats": False,
}


# A LoRA adapter of the base (rank 2 on the full-attention layer's query
# and value projections, KerasHub's default targets) in a runtime adapter
# slot: every other request uses it, so preempted adapter requests are
# recomputed with their adapter too.
ADAPTER_TEXTS = ["alpha beta gamma alpha beta gamma alpha beta gamma."] * 4
ADAPTERS = ["support", None] * 5


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    import keras_vllm

    root = tmp_path_factory.mktemp("kv_pressure_hybrid")
    models = {
        None: trained_models.trained(HYBRID_FAMILY),
        "support": trained_models.lora_fine_tune(
            HYBRID_FAMILY, ADAPTER_TEXTS, rank=2
        ),
    }
    export = {"max_sequence_length": HYBRID_ENGINE["max_model_len"],
              "golden_prompts": []}
    base = models[None].export_vllm(root / "base", weights="full", **export)
    adapter = models["support"].export_vllm(
        root / "support", base=base, **export
    )
    engine = keras_vllm.KerasVllmEngine.from_export(
        base, adapters={"support": adapter}, **HYBRID_ENGINE
    )
    yield engine, models
    serving_checks.shutdown(engine)


def test_preempted_recurrent_state_is_recomputed(hybrid):
    from vllm import SamplingParams

    engine, models = hybrid
    prompts = [
        reference.prompt_token_ids(models[None], text)
        for text in serving_checks.serving_prompts()
    ]
    adapters = ADAPTERS[: len(prompts)]
    expected = {
        name: serving_checks.expected_batch(
            reference.greedy_by_forward_pass, model, prompts,
            serving_checks.NEW_TOKENS,
        )
        for name, model in models.items()
    }
    assert expected["support"] != expected[None], "the adapter changes nothing"
    want = [expected[name][i] for i, name in enumerate(adapters)]
    assert len({tuple(w) for w in want}) > 2, "outputs ignore the prompt"
    params = SamplingParams(
        temperature=0.0, max_tokens=serving_checks.NEW_TOKENS,
        ignore_eos=True,
    )
    preempted = _metric(engine, "vllm:num_preemptions")
    outputs = engine.generate(
        [{"prompt_token_ids": p} for p in prompts], params, adapter=adapters
    )
    got = [list(o.outputs[0].token_ids) for o in outputs]
    mismatches = [
        (i, adapters[i], g, w)
        for i, (g, w) in enumerate(zip(got, want)) if g != w
    ]
    assert not mismatches, mismatches
    assert _metric(engine, "vllm:num_preemptions") > preempted
