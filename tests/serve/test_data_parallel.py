"""Data-parallel serving (`data_parallel_size=2`) on virtual JAX CPU devices.

tpu-inference serves data parallelism as one engine over a `(data, model)`
mesh: its `DPScheduler` places each request on one replica, each replica
caches its requests in its own KV-cache pages, and one SPMD program runs
every replica's batch. One engine per configuration, DP=2 alone and
DP=2 x TP=2 (4 devices), and plain `vllm serve --data-parallel-size 2` over
HTTP, on the same fine-tuned tiny Llama as the single-device tests;
refusals need no engine.
"""

import numpy as np
import pytest

pytest.importorskip("tpu_inference")

from helpers import serving_checks  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from helpers.trained_models import trained_copy  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402

FAMILY = "llama"
CASES = [(2, 1), (2, 2)]  # (data_parallel_size, tensor_parallel_size)
NEW_TOKENS = 16


def _prompts():
    """18 distinct prompts of different lengths, sent at once."""
    base = serving_checks.serving_prompts()
    return [
        text + " more" * i for i, text in enumerate((base * 2)[:18])
    ]


def _ids(causal_lm, prompts):
    return [reference.prompt_token_ids(causal_lm, text) for text in prompts]


def _greedy(engine, prompts):
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    return [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params)]


# DP=2 x TP=2 (a 4-device mesh) is in `-m matrix`: ~1.5 minutes of CI for
# the same replica split on a wider mesh.
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(
            case,
            marks=pytest.mark.matrix if case[1] > 1 else (),
            id=f"dp{case[0]}-tp{case[1]}",
        )
        for case in CASES
    ],
)
def served(request, tmp_path_factory):
    dp, tp = request.param
    model = trained(FAMILY)
    engine = serving_checks.start_engine(
        model,
        tmp_path_factory.mktemp(f"dp{dp}_tp{tp}") / "artifact",
        data_parallel_size=dp,
        tensor_parallel_size=tp,
    )
    # Read before any request: no replica has cached anything yet.
    engine.pages_at_start = engine.kv_pages_per_replica()
    yield dp, tp, model, engine
    serving_checks.shutdown(engine)


def test_concurrent_greedy_requests_match_generate_on_every_replica(served):
    """18 requests at once: tokens equal `generate()`'s, and both replicas
    served some (each wrote KV pages of its own)."""
    dp, _, model, engine = served
    assert engine.pages_at_start == [0] * dp
    prompts = _prompts()
    expected = serving_checks.expected_batch(
        reference.greedy_continuation, model, _ids(model, prompts), NEW_TOKENS
    )
    served_tokens = _greedy(engine, prompts)
    mismatches = [
        (text, want, got)
        for text, want, got in zip(prompts, expected, served_tokens)
        if want != got
    ]
    assert not mismatches, mismatches
    assert len({tuple(w) for w in expected}) > 2, "outputs ignore the prompt"
    pages = engine.kv_pages_per_replica()
    assert len(pages) == dp and all(count > 0 for count in pages), pages


def test_prompt_logprobs_match_forward_pass(served):
    _, _, model, engine = served
    serving_checks.check_prompt_logprobs(engine, model, atol=1e-4)


def test_weights_lie_on_every_device_of_the_mesh(served):
    """DP x TP devices, as tpu-inference's own JAX models lie there: the
    vocabulary split over both mesh axes, attention heads over `model`,
    the rest whole on every replica."""
    dp, tp, _, engine = served
    layout = engine.weights_layout()
    assert len(layout["devices"]) == dp * tp
    specs = {path: v["spec"] for path, v in layout["variables"].items()}
    embedding = next(
        s for p, s in specs.items() if p.endswith("token_embedding/embeddings")
    )
    assert embedding == ["data+model", None]
    query = next(s for p, s in specs.items() if p.endswith("query/kernel"))
    # (Specs drop trailing unsplit axes, and axes of one device.)
    if tp > 1:
        assert query[:2] == [None, "model"]
    else:
        assert "model" not in query
    norms = [s for p, s in specs.items() if p.endswith("layernorm/scale")]
    assert norms and not any(axis for spec in norms for axis in spec)


def test_structured_outputs_are_refused_by_name(served):
    """tpu-inference's data-parallel scheduler cannot hand a grammar to a
    replica (the engine would stop): such a request is refused, and the
    engine serves on."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import StructuredOutputsParams

    _, _, model, engine = served
    params = SamplingParams(
        max_tokens=4,
        structured_outputs=StructuredOutputsParams(choice=["yes", "no"]),
    )
    with pytest.raises(VLLMValidationError, match="data-parallel engine"):
        engine.generate(["a"], params)
    prompts = _prompts()[:2]
    assert _greedy(engine, prompts) == serving_checks.expected_batch(
        reference.greedy_continuation, model, _ids(model, prompts), NEW_TOKENS
    )


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory):
    """The fixture with other weights, exported (for the live update)."""
    other = trained_copy(FAMILY)
    rng = np.random.default_rng(0)
    other.set_weights([
        w + rng.normal(0, 0.05, w.shape).astype(w.dtype)
        for w in other.get_weights()
    ])
    path = other.export_vllm(
        tmp_path_factory.mktemp("other") / "artifact",
        max_sequence_length=256, golden_prompts=[],
    )
    return other, path


def test_live_update_reaches_every_replica(served, other_weights):
    """Last in the module: the engine serves other weights afterwards."""
    _, _, _, engine = served
    other, path = other_weights
    result = engine.update_weights(path)
    assert result["variables"] > 0
    prompts = _prompts()
    expected = serving_checks.expected_batch(
        reference.greedy_continuation, other, _ids(other, prompts), NEW_TOKENS
    )
    assert _greedy(engine, prompts) == expected
    assert all(count > 0 for count in engine.kv_pages_per_replica())


# Refusals: before anything starts, no engine.


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return trained(FAMILY).export_vllm(
        tmp_path_factory.mktemp("refused") / "artifact", golden_prompts=[]
    )


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"data_parallel_size": 3}, "must be a power of two"),
        ({"data_parallel_size": 0}, "an integer of at least 1"),
        ({"data_parallel_size": 2, "max_loras": 1}, "with LoRA adapters"),
    ],
)
def test_sizes_that_cannot_work_are_refused_before_vllm_starts(
    artifact, settings, words, monkeypatch
):
    import vllm

    import keras_vllm

    def no_engine(*args, **kwargs):
        raise AssertionError("vLLM was started")

    monkeypatch.setattr(vllm, "LLM", no_engine)
    with pytest.raises(keras_vllm.ServingError, match=words):
        keras_vllm.KerasVllmEngine.from_export(artifact, **settings)


def test_vllm_serve_refuses_the_same_settings(artifact):
    """`vllm serve`'s plugin check (`serve/frontend/refusals.py`) judges
    `--data-parallel-size` and `--enable-lora` alike."""
    from keras_vllm.serve.frontend import refusals

    assert refusals.refusal(artifact, ["--data-parallel-size", "2"]) is None
    assert "power of two" in refusals.refusal(
        artifact, ["--data-parallel-size", "6"]
    )
    assert "with LoRA adapters" in refusals.refusal(
        artifact, ["-dp", "2", "--enable-lora"]
    )
    assert refusals.refusal(artifact, ["--enable-lora"]) is None


def test_a_data_parallel_batch_reads_each_replicas_metadata():
    """The served model's readers of vLLM's ragged metadata follow the
    data-parallel layout: replica blocks of tokens, each with its own
    `query_start_loc` offsets, request counts and `seq_lens`."""
    import types

    from keras_vllm.layers.common.context import ServingContext

    # Two replicas, 8 token rows each (4 requests a replica at most):
    # replica 0 serves requests of 3 and 2 tokens, replica 1 one of 4.
    metadata = types.SimpleNamespace(
        query_start_loc=np.array([0, 3, 5, 5, 5, 0, 4, 4, 4, 4], np.int32),
        request_distribution=np.array([0, 0, 2, 0, 0, 1], np.int32),
        seq_lens=np.array([7, 2, 0, 0, 9, 0, 0, 0], np.int32),
    )
    context = ServingContext([], metadata, np.zeros(16, np.int32))
    context.replicas = lambda: 2
    real = np.asarray(context.real_tokens())
    assert real.tolist() == [True] * 5 + [False] * 3 + [True] * 4 + [False] * 4
    requests = np.asarray(context.token_requests())
    assert requests[real].tolist() == [0, 0, 0, 1, 1, 4, 4, 4, 4]
    lengths = metadata.seq_lens[requests[real]]
    assert lengths.tolist() == [7, 7, 7, 2, 2, 9, 9, 9, 9]


# Plain `vllm serve --data-parallel-size 2` over HTTP: one more engine.


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    import os
    import sys

    from helpers import engine_shapes
    from helpers.http_server import running_server

    model = trained(FAMILY)
    path = model.export_vllm(
        tmp_path_factory.mktemp("http") / "artifact",
        max_sequence_length=256, golden_prompts=[],
    )
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    log_path = tmp_path_factory.mktemp("http_log") / "server.log"
    command = [vllm, "serve", path, "--data-parallel-size", "2",
               *engine_shapes.SERVE_ARGS]
    with running_server(command, log_path, timeout=600) as url:
        yield url, path, model


# A second data-parallel engine behind `vllm serve` (~2 minutes of CI);
# in `-m matrix`.
@pytest.mark.matrix
def test_vllm_serve_answers_concurrent_clients_exactly(http_server):
    """18 clients at once (vLLM puts two API servers in front of the one
    data-parallel engine); a structured request gets a 400 naming it, and
    the server serves on."""
    import concurrent.futures

    requests = pytest.importorskip("requests")
    url, path, model = http_server
    prompts = _prompts()
    ids = _ids(model, prompts)
    expected = serving_checks.expected_batch(
        reference.greedy_continuation, model, ids, NEW_TOKENS
    )

    def complete(prompt_ids):
        response = requests.post(url + "/v1/completions", json={
            "model": path, "prompt": prompt_ids, "max_tokens": NEW_TOKENS,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
        }, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["token_ids"]

    with concurrent.futures.ThreadPoolExecutor(len(ids)) as pool:
        assert list(pool.map(complete, ids)) == expected
    response = requests.post(url + "/v1/completions", json={
        "model": path, "prompt": "a", "max_tokens": 4,
        "structured_outputs": {"choice": ["yes", "no"]},
    }, timeout=120)
    assert response.status_code == 400, response.text
    assert "data-parallel engine" in response.text
    assert complete(ids[0]) == expected[0]
