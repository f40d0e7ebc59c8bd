"""Several decode steps per engine step (`keras_vllm/serve/decode_steps.py`,
tpu-inference's continue decode).

The checks before vLLM starts run without an engine (well under a second);
one engine serves the fine-tuned Llama 3 fixture with continue decode and
must give `generate()`'s greedy tokens, the plain engine's stops at EOS,
at stop tokens and at `max_tokens`, and its logprobs (~45 s on 2 cores:
export, engine start, a plain engine's outputs for the stops).
"""

import json
import types

import pytest

from keras_vllm.errors import ServingError
from keras_vllm.serve import decode_steps
from keras_vllm.serve import preflight

CONTINUE = {"enable_continue_decode": True, "max_decode_steps": 8}


def _artifact(config=None):
    """What `check` reads of an opened artifact."""
    config = {"num_hidden_layers": 4, **(config or {})}
    return types.SimpleNamespace(
        path="/exports/tuned", manifest={}, read_json=lambda name: config
    )


def test_continue_decode_turns_async_scheduling_off():
    kwargs = {"additional_config": CONTINUE}
    decode_steps.check(_artifact(), kwargs)
    assert kwargs["async_scheduling"] is False
    # As `vllm serve --additional-config JSON` gives it.
    kwargs = {"additional_config": json.dumps(CONTINUE)}
    decode_steps.check(_artifact(), kwargs)
    assert kwargs["async_scheduling"] is False
    # Off: nothing changes.
    for kwargs in ({}, {"additional_config": {"max_decode_steps": 8}}):
        decode_steps.check(_artifact(), kwargs)
        assert "async_scheduling" not in kwargs


@pytest.mark.parametrize("config, kwargs, says", [
    ({}, {"async_scheduling": True}, "async_scheduling=True"),
    ({"recurrent_state_layers": [0, 2]}, {}, "layers [0, 2] keep a recurrent"),
    ({}, {"speculative_config": {"method": "ngram"}}, "speculative_config"),
    ({}, {"data_parallel_size": 2}, "data_parallel_size"),
    ({}, {"enable_lora": True}, "enable_lora"),
])
def test_what_the_decode_loop_would_not_serve_is_refused(config, kwargs, says):
    with pytest.raises(ServingError) as info:
        decode_steps.check(
            _artifact(config), {"additional_config": CONTINUE, **kwargs}
        )
    assert says in str(info.value)
    assert "enable_continue_decode" in str(info.value)


def test_the_command_line_is_read():
    argv = ["--additional-config", json.dumps(CONTINUE),
            "--no-async-scheduling"]
    overrides = preflight.overrides_from_argv(argv)
    assert overrides["additional_config"] == json.dumps(CONTINUE)
    assert overrides["async_scheduling"] is False
    assert decode_steps.enabled(overrides)
    assert preflight.overrides_from_argv(["--async-scheduling"]) == {
        "async_scheduling": True
    }


@pytest.mark.serving
def test_continue_decode_serves_the_plain_engines_tokens(tmp_path):
    from vllm import SamplingParams

    import keras_vllm
    from helpers import serving_checks
    from helpers.trained_models import trained
    from keras_vllm.cli.serve import serve_command

    model = trained("llama3")
    engine = serving_checks.start_engine(
        model, tmp_path / "artifact", additional_config=CONTINUE
    )
    try:
        config = engine.llm.llm_engine.vllm_config
        assert config.scheduler_config.async_scheduling is False
        # Greedy tokens of 9 prompts equal `generate()`'s.
        serving_checks.check_greedy_matches_generate(engine, model)
        prompts = serving_checks.serving_prompts()
        params = [
            SamplingParams(temperature=0.0, max_tokens=60),  # EOS
            SamplingParams(temperature=0.0, max_tokens=11, ignore_eos=True,
                           logprobs=2),
            SamplingParams(temperature=0.0, max_tokens=40,
                           stop_token_ids=[13]),
        ]
        served = [engine.generate(prompts, p, use_tqdm=False) for p in params]
    finally:
        serving_checks.shutdown(engine)
    plain = keras_vllm.KerasVllmEngine.from_export(
        tmp_path / "artifact", max_num_seqs=16, max_num_batched_tokens=256
    )
    try:
        wanted = [plain.generate(prompts, p, use_tqdm=False) for p in params]
    finally:
        serving_checks.shutdown(plain)

    def tokens(outputs):
        return [
            (list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
            for o in outputs
        ]

    def logprobs(outputs):
        return [
            {i: lp.logprob for i, lp in d.items()}
            for o in outputs
            for d in (o.outputs[0].logprobs or [])
        ]

    for got, want in zip(served, wanted):
        assert tokens(got) == tokens(want)
        # The same ids, values equal up to float32 summation order (the
        # on-device loop is another program than the plain step; rounding
        # both to 4 decimals flipped one of ~200 values in a CI run).
        for g, w in zip(logprobs(got), logprobs(want), strict=True):
            assert g.keys() == w.keys()
            assert all(abs(g[i] - w[i]) < 1e-4 for i in g), (g, w)
    reasons = {o.outputs[0].finish_reason for out in served for o in out}
    assert reasons == {"stop", "length"}
    # `keras-vllm serve` passes the scheduling the loop needs.
    command = serve_command(
        str(tmp_path / "artifact"), ["--additional-config", json.dumps(CONTINUE)]
    )
    assert "--no-async-scheduling" in command
