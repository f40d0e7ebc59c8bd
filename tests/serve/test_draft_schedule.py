"""N-gram drafting that steps aside (`keras_vllm/serve/worker/draft_schedule.py`
and its checks in `serve/speculation.py`).

Cost: the stand-in and refusal tests well under a second; one engine
(~40 s on a 2-core host: the bench's 2.5M-parameter tiny Qwen2 whose greedy
output repeats the prompt's last token, so every n-gram draft after the
first repeats is accepted).
"""

import types

import numpy as np
import pytest

from keras_vllm.errors import ServingError
from keras_vllm.serve import speculation
from keras_vllm.serve.worker import draft_schedule

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}
# Four drafts a step for a batch of one request, none for more.
ONE_ONLY = [[1, 1, 4], [2, 1024, 0]]


def _artifact():
    return types.SimpleNamespace(
        path="/exports/tuned", manifest={},
        read_json=lambda name: {"num_hidden_layers": 2},
    )


def test_gate_pauses_everyones_drafts_below_the_floor_then_tries_again():
    gate = draft_schedule.AcceptanceGate(0.5, window_steps=2, pause_steps=3)
    four = {"a": [1] * 4, "b": [1] * 4}
    # 3 of 8 accepted a step (a: 1 of 4, b: 2 of 4): 37.5% over the window.
    for _ in range(2):
        assert gate.allows()
        gate.record(["a", "b"], four, [[5, 6], [5, 6, 7]])
    assert [gate.allows() for _ in range(4)] == [False] * 3 + [True]
    # 6 of 8 (75%): drafting goes on.
    for _ in range(2):
        gate.record(["a", "b"], four, [[5, 6, 7, 8], [5, 6, 7]])
    assert gate.allows()
    # Steps without drafts (prefills, nothing found) count for nothing.
    for _ in range(4):
        gate.record(["a", "b"], {}, [[5], [5]])
        gate.record(["a"], {"a": [1]}, [[]])
    assert gate.allows()


# The tokens a step gave requests "a" (1 of 4 drafts accepted) and "b"
# (none accepted).
SAMPLED = [[1, 2], [1]]


@pytest.fixture
def sampled_on_the_host(monkeypatch):
    """tpu-inference's extraction of the step's tokens, stood in for."""
    monkeypatch.setattr(
        draft_schedule, "_sampled_tokens",
        lambda runner, arguments: arguments["sampled_output"],
    )


def _manager(model_type, scheduled, floor=None, dynamic=True):
    """A stand-in for tpu-inference's manager, runner and n-gram drafter:
    the drafter proposes `k` tokens for every request and records `k`."""
    from keras_vllm import format as fmt

    seen = []

    class Drafter:
        def propose(self, k, sampled, num_tokens, token_ids):
            seen.append(k)
            return [[9] * k for _ in sampled]

    config = types.SimpleNamespace(
        method="ngram", num_speculative_tokens=4,
        uses_dynamic_speculative_decoding=lambda: dynamic,
    )
    runner = types.SimpleNamespace(
        speculative_config=config, drafter=Drafter(),
        model_config=types.SimpleNamespace(
            hf_config=types.SimpleNamespace(model_type=model_type)
        ),
        vllm_config=types.SimpleNamespace(
            additional_config={} if floor is None
            else {draft_schedule.MIN_ACCEPTANCE_KEY: floor}
        ),
        input_batch=types.SimpleNamespace(
            num_reqs=2, req_ids=["a", "b"],
            num_tokens_no_spec=np.array([3, 5]),
            token_ids_cpu=np.zeros((2, 16), np.int32),
        ),
    )

    class Manager:
        def __init__(self):
            self.runner = runner

        def propose_draft_token_ids(
            self, sampled_output=None, logits_indices_selector=None,
            discard_sampled_tokens_req_indices=(), spec_decode_metadata=None,
            scheduler_output=None,
        ):
            # tpu-inference's n-gram branch, reduced.
            num_spec = self.runner.speculative_config.num_speculative_tokens
            batch = self.runner.input_batch
            proposed = self.runner.drafter.propose(
                num_spec, sampled_output, batch.num_tokens_no_spec,
                batch.token_ids_cpu,
            )
            self._draft_token_ids = [t[:num_spec] for t in proposed]

    Manager.propose_draft_token_ids = draft_schedule._scheduled(
        Manager.propose_draft_token_ids
    )
    output = types.SimpleNamespace(
        num_spec_tokens_to_schedule=scheduled, finished_req_ids=set(),
        scheduled_spec_decode_tokens={"a": [9, 9, 9, 9], "b": [9, 9, 9, 9]},
    )
    return Manager(), output, seen


def test_the_batch_size_schedule_sets_the_drafts(sampled_on_the_host):
    from keras_vllm import format as fmt

    manager, output, seen = _manager(fmt.MODEL_TYPE, scheduled=2)
    manager.propose_draft_token_ids(SAMPLED, scheduler_output=output)
    assert seen == [2] and manager._draft_token_ids == [[9, 9]] * 2
    # None at this batch size: no lookup at all.
    manager, output, seen = _manager(fmt.MODEL_TYPE, scheduled=0)
    manager.propose_draft_token_ids(SAMPLED, scheduler_output=output)
    assert seen == [] and manager._draft_token_ids == [[], []]
    assert "propose" not in vars(manager.runner.drafter)
    # Without a schedule, or for other models: every draft.
    for model_type, dynamic in ((fmt.MODEL_TYPE, False), ("llama", True)):
        manager, output, seen = _manager(model_type, 0, dynamic=dynamic)
        manager.propose_draft_token_ids(SAMPLED, scheduler_output=output)
        assert seen == [4] and manager._draft_token_ids == [[9] * 4] * 2


def test_drafts_continue_the_tokens_just_sampled(sampled_on_the_host):
    """vLLM's n-gram lookup on a request whose text repeats every three
    tokens: tpu-inference 0.32.0 drafted before appending the step's token,
    so its drafts continued the text one token back and were rejected."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    from keras_vllm import format as fmt

    config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(
            prompt_lookup_min=2, prompt_lookup_max=4,
            num_speculative_tokens=4,
        ),
        model_config=types.SimpleNamespace(max_model_len=16),
        scheduler_config=types.SimpleNamespace(max_num_seqs=2),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
    )
    manager, output, _ = _manager(fmt.MODEL_TYPE, 4, dynamic=False)
    batch = manager.runner.input_batch
    manager.runner.drafter = NgramProposer(config)
    batch.num_reqs, batch.req_ids = 1, ["a"]
    batch.token_ids_cpu[0, :8] = [5, 6, 7, 5, 6, 7, 5, 6]
    batch.num_tokens_no_spec = np.array([8, 0])
    # This step gave "a" a 7: what follows is 5, 6, 7, 5, ...
    manager.propose_draft_token_ids([[7]], scheduler_output=output)
    assert manager._draft_token_ids[0][:3] == [5, 6, 7]
    # The runner appends the 7 itself afterwards, where it already is.
    assert batch.token_ids_cpu[0, :9].tolist() == [5, 6, 7] * 3
    assert batch.num_tokens_no_spec.tolist() == [8, 0]


def test_the_acceptance_floor_pauses_drafting(sampled_on_the_host):
    from keras_vllm import format as fmt

    # Each step verified 4 drafts for "a" and "b" and accepted 1 of the 8.
    manager, output, seen = _manager(fmt.MODEL_TYPE, 4, floor=0.5)
    for _ in range(draft_schedule.WINDOW_STEPS - 1):
        manager.propose_draft_token_ids(SAMPLED, scheduler_output=output)
        assert manager._draft_token_ids == [[9] * 4] * 2
    # The window's last step judges it: below the floor, nothing drafted
    # (no lookup) for the pause.
    drafts = output.scheduled_spec_decode_tokens
    for _ in range(draft_schedule.PAUSE_STEPS):
        manager.propose_draft_token_ids(SAMPLED, scheduler_output=output)
        assert manager._draft_token_ids == [[], []]
        output.scheduled_spec_decode_tokens = {}  # plain steps follow
    assert len(seen) == draft_schedule.WINDOW_STEPS - 1
    manager.propose_draft_token_ids(SAMPLED, scheduler_output=output)
    assert manager._draft_token_ids == [[9] * 4] * 2
    output.scheduled_spec_decode_tokens = drafts


@pytest.mark.parametrize("config, kwargs, says", [
    (dict(NGRAM, num_speculative_tokens_per_batch_size=[[0, 4, 4]]), {},
     "must be positive"),
    (dict(NGRAM, num_speculative_tokens_per_batch_size="1-8"), {},
     "non-empty list"),
    (dict(NGRAM, num_speculative_tokens_per_batch_size=[[2, 8, 4]]), {},
     "start at 1"),
    (NGRAM, {"additional_config": {"min_draft_acceptance": 1.5}},
     "from 0 to 1"),
    (NGRAM, {"additional_config": '{"min_draft_acceptance": "high"}'},
     "from 0 to 1"),
    (None, {"additional_config": {"min_draft_acceptance": 0.3}},
     "without n-gram speculation"),
])
def test_bad_schedules_and_floors_are_refused_before_vllm_starts(
    config, kwargs, says
):
    with pytest.raises(ServingError, match=says) as info:
        speculation.check(_artifact(), {"speculative_config": config, **kwargs})
    assert "e.g." in str(info.value)


def test_mtp_with_a_schedule_is_refused_by_name():
    config = {"method": "mtp", "model": "exports/assistant",
              "num_speculative_tokens": 3,
              "num_speculative_tokens_per_batch_size": ONE_ONLY}
    with pytest.raises(ServingError, match="n-gram speculation only"):
        speculation.check(_artifact(), {"speculative_config": config})


def test_good_schedules_and_floors_pass():
    speculation.check(_artifact(), {
        "speculative_config": dict(
            NGRAM, num_speculative_tokens_per_batch_size=ONE_ONLY
        ),
        "additional_config": {"min_draft_acceptance": 0.25},
    })


@pytest.fixture(scope="module")
def repeating(tmp_path_factory):
    from helpers import serving_checks
    from keras_vllm.bench import models
    from keras_vllm.bench import speculative

    model = models.build("tiny")
    speculative.repeat_last_token(model)
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp("schedule") / "artifact",
        speculative_config=dict(
            NGRAM, num_speculative_tokens_per_batch_size=ONE_ONLY
        ),
        additional_config={"min_draft_acceptance": 0.2},
        per_request_spec_decode_metrics="summary",
    )
    yield model, engine
    serving_checks.shutdown(engine)


def _served(engine, prompts, new_tokens):
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=new_tokens, ignore_eos=True
    )
    return engine.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
    )


def test_drafts_at_batch_one_and_none_above_with_generates_tokens(repeating):
    from helpers import serving_checks
    from keras_vllm.hub import reference

    model, engine = repeating
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 200, 8).tolist() for _ in range(4)]
    new_tokens = 24
    alone = _served(engine, prompts[:1], new_tokens)
    together = _served(engine, prompts, new_tokens)
    expected = serving_checks.expected_batch(
        reference.greedy_continuation, model, prompts, new_tokens
    )
    assert [list(o.outputs[0].token_ids) for o in alone] == expected[:1]
    assert [list(o.outputs[0].token_ids) for o in together] == expected
    metrics = alone[0].outputs[0].spec_decode_metrics
    # The repeats were drafted and accepted, several tokens a step.
    assert sum(j * n for j, n in enumerate(metrics.histogram)) > new_tokens / 2
    # Four requests a step: nothing drafted.
    assert [o.outputs[0].spec_decode_metrics.num_draft_tokens
            for o in together] == [0] * 4


def test_steps_without_drafts_are_laid_out_plain():
    """`_prepare_inputs` sees no speculative config in a step where no
    request has drafts (tpu-inference then builds no verification
    metadata), and the rest of the step reads it again."""
    from keras_vllm import format as fmt

    config = types.SimpleNamespace(method="ngram")

    class Runner:
        model_config = types.SimpleNamespace(
            hf_config=types.SimpleNamespace(model_type=fmt.MODEL_TYPE)
        )
        scheduler_config = types.SimpleNamespace(async_scheduling=False)

        def __init__(self):
            self.speculative_config = config

        def _prepare_inputs(self, scheduler_output):
            return self.speculative_config

    Runner._prepare_inputs = draft_schedule._plain_when_undrafted(
        Runner._prepare_inputs
    )
    runner = Runner()

    def step(drafts):
        return types.SimpleNamespace(scheduled_spec_decode_tokens=drafts)

    assert runner._prepare_inputs(step({})) is None
    assert runner._prepare_inputs(step({"a": []})) is None
    assert runner.speculative_config is config
    assert runner._prepare_inputs(step({"a": [5, 6]})) is config
    # Not with asynchronous scheduling (MTP drafts on the device).
    runner.scheduler_config = types.SimpleNamespace(async_scheduling=True)
    assert runner._prepare_inputs(step({})) is config
    extract = draft_schedule._nothing_for_plain_steps(lambda m, *a: ("ran", m))
    assert extract(None, "tokens") == (None, None)
    assert extract("metadata", "tokens") == ("ran", "metadata")
