"""Every served family on vLLM (CPU backend) equals KerasHub, token for token.

One engine per family (vLLM's default multiprocess mode and scheduling,
sized to the checks by `helpers.engine_shapes`), torn down before the next
family starts.
"""

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

from helpers import serving_checks  # noqa: E402
from helpers import trained_models  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402

# Every family, each in its tested tiny variant (`trained_models.VARIANTS`:
# rope scaling, windows shorter than the prompts, Gemma 3's global layer,
# Phi-3's "su" RoPE). The tiny Mistral and Mixtral use a 16-token window,
# shorter than the longest prompts.
SERVED = sorted(trained_models.VARIANTS)


# Where greedy expectations come from, when not `generate()`. KerasHub's
# GPT-NeoX `generate()` rotates decode queries at position 0 (its cached
# decoding is wrong), so its reference is greedy decoding by full forward
# passes.
REFERENCE = {"gpt_neo_x": reference.greedy_by_forward_pass}


@pytest.fixture(scope="module", params=SERVED)
def served(request, tmp_path_factory):
    family = request.param
    model = trained(family)
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp(family) / "artifact"
    )
    yield family, model, engine
    serving_checks.shutdown(engine)


def _greedy(family):
    return REFERENCE.get(family, reference.greedy_continuation)


def test_greedy_matches_generate(served):
    family, model, engine = served
    serving_checks.check_greedy_matches_generate(
        engine, model, greedy=_greedy(family)
    )


def test_prompt_logprobs_match_forward_pass(served):
    _, model, engine = served
    serving_checks.check_prompt_logprobs(engine, model)


def test_default_sampling_follows_exported_sampler(served):
    family, model, engine = served
    serving_checks.check_default_sampling_is_the_models(
        engine, model, greedy=_greedy(family)
    )


def test_golden_outputs_replay_on_the_engine(served):
    """What `keras-vllm verify --engine` checks, for every family: the
    golden outputs export recorded (with the family's declared reference,
    the forward pass for GPT-NeoX) are what the engine serves."""
    _, _, engine = served
    assert engine.check_golden() == []


def test_every_family_is_served():
    assert set(SERVED) == set(testing.FAMILIES)
