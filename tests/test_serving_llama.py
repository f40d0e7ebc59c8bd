"""Llama 3 served on vLLM (CPU backend) equals `generate()` token for token."""

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import serving_checks  # noqa: E402
from conftest import trained  # noqa: E402
from keras_vllm import testing  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return trained("llama3", **testing.LLAMA3_1_ROPE_SCALING)


@pytest.fixture(scope="module")
def engine(model, tmp_path_factory):
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp("llama") / "artifact"
    )
    yield engine
    serving_checks.shutdown(engine)


def test_greedy_matches_generate(engine, model):
    serving_checks.check_greedy_matches_generate(engine, model)


def test_prompt_logprobs_match_forward_pass(engine, model):
    serving_checks.check_prompt_logprobs(engine, model)


def test_default_sampling_follows_exported_sampler(engine, model):
    serving_checks.check_default_sampling_is_the_models(engine, model)
