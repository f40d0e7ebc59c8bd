"""Every served family on vLLM (CPU backend) equals KerasHub, token for token.

One engine per family (vLLM's default multiprocess mode and scheduling),
torn down before the next family starts.
"""

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import serving_checks  # noqa: E402
from conftest import trained  # noqa: E402
from keras_vllm import testing  # noqa: E402

# Families with a paged subclass, and the tiny-config variants that exercise
# their mechanics (rope scaling, windows shorter than the prompts).
SERVED = {
    "llama3": testing.LLAMA3_1_ROPE_SCALING,
    "llama": {},
    "gemma": {},
    "gemma2": {},
    "gpt2": {},
}


@pytest.fixture(scope="module", params=sorted(SERVED))
def served(request, tmp_path_factory):
    family = request.param
    model = trained(family, **SERVED[family])
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp(family) / "artifact"
    )
    yield family, model, engine
    serving_checks.shutdown(engine)


def test_greedy_matches_generate(served):
    _, model, engine = served
    serving_checks.check_greedy_matches_generate(engine, model)


def test_prompt_logprobs_match_forward_pass(served):
    _, model, engine = served
    serving_checks.check_prompt_logprobs(engine, model)


def test_default_sampling_follows_exported_sampler(served):
    _, model, engine = served
    serving_checks.check_default_sampling_is_the_models(engine, model)


@pytest.mark.parametrize(
    "family", [f for f in testing.FAMILIES if f not in SERVED]
)
def test_unserved_families_are_refused_by_name(family, tmp_path):
    import keras_vllm

    model = testing.build_tiny_causal_lm(family)
    with pytest.raises(keras_vllm.UnsupportedModelError, match="Attention"):
        model.export_vllm(tmp_path / "artifact")
