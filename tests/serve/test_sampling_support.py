"""Sampling parameters vLLM's TPU backend does not apply are refused
(`keras_vllm/serve/frontend/sampling.py`); engines answering such requests are
`test_vllm_serve.py` (HTTP) and `test_weight_updates.py` (`generate`)."""

import logging

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402

from keras_vllm import envs  # noqa: E402
from keras_vllm import patching  # noqa: E402
from keras_vllm.serve.frontend import sampling  # noqa: E402

UNAPPLIED = [
    ("presence_penalty", 0.5),
    ("frequency_penalty", -0.3),
    ("repetition_penalty", 1.2),
    ("min_p", 0.1),
    ("logit_bias", {5: 3.0}),
    ("bad_words", ["the"]),
]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_parameters_the_backend_applies_pass(temperature):
    sampling.check(
        SamplingParams(
            temperature=temperature, top_k=5, top_p=0.9, max_tokens=4,
            min_tokens=2, n=1 if temperature == 0 else 2, logprobs=3, prompt_logprobs=1, stop=["."],
            presence_penalty=0.0, repetition_penalty=1.0,
        )
    )


@pytest.mark.parametrize("name, value", UNAPPLIED)
def test_each_unapplied_parameter_is_refused_by_name(name, value):
    with pytest.raises(VLLMValidationError) as info:
        sampling.check(
            SamplingParams(temperature=0.7, max_tokens=4, **{name: value})
        )
    assert info.value.parameter == name
    assert f"{name}=" in str(info.value)
    assert envs.UNAPPLIED_SAMPLING.name in str(info.value)


def test_min_p_passes_a_greedy_request():
    # The most likely token always survives a min-p filter.
    sampling.check(SamplingParams(temperature=0.0, min_p=0.2))
    with pytest.raises(VLLMValidationError):
        sampling.check(
            SamplingParams(temperature=0.0, repetition_penalty=1.1)
        )


def test_ignore_serves_them_with_one_warning_each(monkeypatch, caplog):
    monkeypatch.setenv(envs.UNAPPLIED_SAMPLING.name, "ignore")
    monkeypatch.setattr(sampling, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="keras_vllm"):
        for _ in range(2):
            for name, value in UNAPPLIED:
                sampling.check(
                    SamplingParams(temperature=0.7, **{name: value})
                )
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == len(UNAPPLIED)
    assert all("not applied" in message for message in warned)


@pytest.mark.parametrize("setting", [None, "ignore"])
def test_allowed_token_ids_is_always_refused(monkeypatch, setting):
    if setting:
        monkeypatch.setenv(envs.UNAPPLIED_SAMPLING.name, setting)
    with pytest.raises(VLLMValidationError) as info:
        sampling.check(SamplingParams(allowed_token_ids=[1, 2]))
    assert info.value.parameter == "allowed_token_ids"
    assert "stop the engine" in str(info.value)


def _processor(model_type):
    import types

    config = types.SimpleNamespace(model_type=model_type)
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=config)
    )


def test_install_wraps_vllm_once_and_leaves_other_models_alone(monkeypatch):
    from vllm.v1.engine.input_processor import InputProcessor

    from keras_vllm import format as fmt

    checked = []

    def vllm_checks(self, params, *args):
        # A stand-in for vLLM's own checks, which the wrapper runs first.
        checked.append(params)
        return "vllm's result"

    monkeypatch.setattr(InputProcessor, "_validate_params", vllm_checks)
    sampling.install()
    wrapped = InputProcessor._validate_params
    sampling.install()
    assert InputProcessor._validate_params is wrapped
    assert patching.original_of(wrapped) is vllm_checks

    unapplied = SamplingParams(temperature=0.7, repetition_penalty=1.3)
    other = _processor("llama")
    assert wrapped(other, unapplied, ()) == "vllm's result"
    with pytest.raises(VLLMValidationError):
        wrapped(_processor(fmt.MODEL_TYPE), unapplied, ())
    plain = SamplingParams(temperature=0.7)
    assert wrapped(_processor(fmt.MODEL_TYPE), plain, ()) == "vllm's result"
    assert len(checked) == 3


def test_a_seed_is_refused_unless_the_request_is_greedy(monkeypatch):
    monkeypatch.setenv(envs.UNAPPLIED_SAMPLING.name, "ignore")
    sampling.check(SamplingParams(temperature=0.0, seed=3))
    with pytest.raises(VLLMValidationError) as info:
        sampling.check(SamplingParams(temperature=0.7, seed=3))
    assert info.value.parameter == "seed"


def test_structured_outputs_are_refused_on_an_engine_that_speculates(
    monkeypatch,
):
    """tpu-inference 0.32 writes one grammar row per request; a verify step
    has one logits row per drafted token (unrefused, a tiny Llama's regex
    requests came back off the grammar and one ended in `error`)."""
    import types

    from vllm.sampling_params import StructuredOutputsParams

    from keras_vllm import format as fmt

    params = SamplingParams(
        temperature=0.0, structured_outputs=StructuredOutputsParams(regex="a+")
    )
    sampling.check(params)
    with pytest.raises(VLLMValidationError) as info:
        sampling.check(params, speculative=True)
    assert info.value.parameter == "structured_outputs"
    assert "speculative_config" in str(info.value)
    sampling.check(SamplingParams(temperature=0.0), speculative=True)

    # The installed check reads the engine's config.
    from vllm.v1.engine.input_processor import InputProcessor

    monkeypatch.setattr(
        InputProcessor, "_validate_params", lambda self, params, *args: None
    )
    sampling.install()
    processor = _processor(fmt.MODEL_TYPE)
    processor.vllm_config = types.SimpleNamespace(
        speculative_config=None, sharding_config=None
    )
    InputProcessor._validate_params(processor, params, ())
    processor.vllm_config.speculative_config = object()
    with pytest.raises(VLLMValidationError):
        InputProcessor._validate_params(processor, params, ())
