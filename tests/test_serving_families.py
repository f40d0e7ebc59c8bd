"""Every served family on vLLM (CPU backend) equals KerasHub, token for token.

One engine per family (vLLM's default multiprocess mode and scheduling),
torn down before the next family starts.
"""

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

import serving_checks  # noqa: E402
from conftest import trained  # noqa: E402
from keras_vllm import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402

# Families with a paged subclass, and the tiny-config variants that exercise
# their mechanics (rope scaling, windows shorter than the prompts).
SERVED = {
    "llama3": testing.LLAMA3_1_ROPE_SCALING,
    "llama": {},
    "gemma": {},
    "gemma2": {},
    # Six layers reach the first global (1M-wavelength RoPE) layer.
    "gemma3": {"num_layers": 6},
    "gpt2": {},
    "gpt_neo_x": {},
    "falcon": {},
    "bloom": {},
    "opt": {},
    # The tiny Mistral and Mixtral use a 16-token window, shorter than the
    # longest prompts.
    "mistral": {},
    "mixtral": {},
    "qwen": {},
    "qwen3": {},
    "qwen_moe": {},
    "qwen3_moe": {},
    # "su" (LongRoPE) rotary. With a pretraining length of 48, the short
    # prompts and their 32 new tokens stay within it (short factors) and the
    # 63- and 67-token prompts exceed it from the start (long factors); a
    # sequence that crosses it while decoding has no single Keras reference
    # (generate() picks the prefill's factors by its padded max_length).
    # Factor lists become tuples: `trained()` caches on the overrides.
    "phi3": {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in testing.PHI3_SU_ROPE_SCALING.items()
    }
    | {"pretraining_sequence_length": 48},
}


# Where greedy expectations come from, when not `generate()`. KerasHub's
# GPT-NeoX `generate()` rotates decode queries at position 0 (its cached
# decoding is wrong), so its reference is greedy decoding by full forward
# passes.
REFERENCE = {"gpt_neo_x": reference.greedy_by_forward_pass}


@pytest.fixture(scope="module", params=sorted(SERVED))
def served(request, tmp_path_factory):
    family = request.param
    model = trained(family, **SERVED[family])
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


def test_every_family_is_served():
    assert set(SERVED) == set(testing.FAMILIES)
