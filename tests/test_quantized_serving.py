"""Keras-quantized models served by the real engine, token for token.

One engine per (family, mode): a rotary GQA family (Llama) and one with
learned positions, biases and LayerNorm (GPT-2), each in Keras' int8 and
calibrated GPTQ modes (int4 artifacts are Keras-side only, see
`test_quantized_format.py`). The engine runs the quantized Keras layers' own
computation (the paged subclasses call the parent's projections), so the
served tokens must equal the quantized model's `generate()`.
"""

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

from helpers import quantized_models  # noqa: E402
from helpers import serving_checks  # noqa: E402

CASES = [
    (family, mode)
    for family in ("llama", "gpt2")
    for mode in quantized_models.SERVED_MODES
]

# Teacher-forced logprobs against Keras' forward pass. int8 layers quantize
# their inputs per token (abs-max over the hidden axis): when XLA sums a
# token's activations in another order for the ragged batch, a value on a
# rounding boundary of that 1/127 scale can round one step the other way.
LOGPROB_ATOL = 1e-3


@pytest.fixture(
    scope="module", params=CASES, ids=[f"{f}-{m}" for f, m in CASES]
)
def served(request, tmp_path_factory):
    family, mode = request.param
    model = quantized_models.quantized(family, mode)
    engine = serving_checks.start_engine(
        model, str(tmp_path_factory.mktemp(f"{family}_{mode}") / "artifact")
    )
    yield model, engine
    engine.shutdown()


def test_greedy_matches_quantized_generate(served):
    model, engine = served
    serving_checks.check_greedy_matches_generate(engine, model)


def test_prompt_logprobs_match_quantized_forward_pass(served):
    model, engine = served
    worst = serving_checks.check_prompt_logprobs(
        engine, model, atol=LOGPROB_ATOL
    )
    print(f"\nworst logprob difference: {worst:.2e}")


def test_golden_outputs_replay(served):
    _, engine = served
    assert engine.check_golden() == []
