"""Keras-quantized models served by the real engine, token for token.

One engine per (family, mode): a rotary GQA family (Llama) and one with
learned positions, biases and LayerNorm (GPT-2), each in Keras' int8, int4
(weights only) and calibrated GPTQ modes; and Mixtral in int8 (its routed
mixture-of-experts blocks: Keras quantizes the router, a Dense, and leaves
the expert banks float). The engine runs the quantized
Keras layers' own computation (the paged subclasses call the parent's projections), so the
served tokens must equal the quantized model's `generate()`. Llama int8 is
also served at TP=2, where the int8 kernels and their scales are split.
Gemma 4 int8 quantizes all but its dense FFN (which KerasHub's decoder
block reads raw; export refuses it quantized, test_gemma4_export.py).
Qwen 3.5 int8: its linear-attention projections and full attention int8,
its recurrent state float32 as in Keras.
"""

import pytest

pytest.importorskip("tpu_inference")

from helpers import family_serving  # noqa: E402
from helpers import quantized_models  # noqa: E402
from helpers import serving_checks  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402

# Each mode on one family in the CI tier: int8 on Llama at TP=2 and in the
# MoE and hybrid cases below (Llama's int8 on one device, ~1 minute more, is
# in `-m matrix` with GPT-2's int8), int4 and GPTQ on GPT-2 (Llama's in
# `-m matrix`).
IN_CI = {"llama": (), "gpt2": ("int4", "gptq")}
CASES = [
    pytest.param(
        (family, mode, 1),
        marks=() if mode in IN_CI[family] else pytest.mark.matrix,
        id=f"{family}-{mode}",
    )
    for family in ("llama", "gpt2")
    for mode in quantized_models.MODES
] + [("llama", "int8", 2), ("mixtral", "int8", 1)]
# Llama int8 at TP=2 also drafts with n-gram speculation
# (`family_serving.SPECULATIVE`): int8, TP=2 and speculation together.
SPECULATING = ("llama", "int8", 2)
# Gemma 4 (the `gemma4` fixture: mixed head sizes, K=V global layer, MoE)
# in int8 with its dense FFN left float (`quantized_models._servable`):
# attention projections, the router and the per-layer projections int8.
# The CI tier covers int8 with routed experts and a hybrid below; Gemma 4's
# case is in `-m matrix`.
CASES.append(
    pytest.param(("gemma4", "int8", 1), marks=pytest.mark.matrix,
                 id="gemma4-int8")
)
# Qwen 3.5 in int8: its Gated DeltaNet projections (`[Q|K|V]`, z, b, a,
# output) are Keras Dense layers the paged layer calls, so they run int8;
# the conv kernel, decay and norm weights stay float, as Keras leaves them.
# Its reference is greedy decoding by the (quantized) forward pass.
CASES.append(("qwen3_5", "int8", 1))

# Teacher-forced logprobs against Keras' forward pass. int4 (weights only)
# and GPTQ dequantize their weights and compute in float: every position
# within LOGPROB_ATOL. int8 layers also quantize their inputs per token (abs-max over the
# hidden axis): when XLA sums a token's activations in another order for the
# ragged batch, a value on a rounding boundary of that 1/127 scale can round
# one step the other way, and that position (and, through attention, later
# ones) moves by up to a tenth (seen: 0.10 on the tiny Llama, 0.05 on GPT-2).
# Most positions stay within LOGPROB_ATOL; a wrong scale moves them all.
LOGPROB_ATOL = 1e-3
ROUNDING_FLIP_ATOL = 0.25
ACTIVATION_QUANTIZING_MODES = ("int8",)


@pytest.fixture(
    scope="module",
    params=CASES,
    ids=[
        None if hasattr(c, "id") else f"{c[0]}-{c[1]}"
        + (f"-tp{c[2]}" if c[2] > 1 else "")
        for c in CASES
    ],
)
def served(request, tmp_path_factory):
    family, mode, tp = request.param
    # Before quantizing (~20 s on a TPU v5e with one chip).
    serving_checks.skip_without_chips({"tensor_parallel_size": tp})
    model = quantized_models.quantized(family, mode)
    engine = serving_checks.start_engine(
        model,
        str(tmp_path_factory.mktemp(f"{family}_{mode}_tp{tp}") / "artifact"),
        tensor_parallel_size=tp,
        **(family_serving.SPECULATIVE if request.param == SPECULATING else {}),
    )
    yield model, engine
    engine.shutdown()


def test_greedy_matches_quantized_generate(served, request):
    model, engine = served
    family, _, _ = request.node.callspec.params["served"]
    greedy = family_serving.REFERENCE.get(
        family, reference.greedy_continuation
    )
    outputs = serving_checks.check_greedy_matches_generate(
        engine, model, greedy=greedy
    )
    if request.node.callspec.params["served"] == SPECULATING:
        # Verify steps ran (the tiny Llama's int8 continuations repeat no
        # n-gram, so every draft is rejected); accepted drafts are checked
        # on a memorized sentence in test_multi_adapter.py.
        family_serving.check_drafts_verified(outputs, accepted=False)


def test_prompt_logprobs_match_quantized_forward_pass(served, request):
    model, engine = served
    _, mode, _ = request.node.callspec.params["served"]
    if mode in ACTIVATION_QUANTIZING_MODES:
        tolerance = {"atol": ROUNDING_FLIP_ATOL, "median_atol": LOGPROB_ATOL}
    else:
        tolerance = {"atol": LOGPROB_ATOL}
    worst = serving_checks.check_prompt_logprobs(engine, model, **tolerance)
    print(f"\nworst logprob difference: {worst:.2e}")


def test_golden_outputs_replay(served):
    _, engine = served
    assert engine.check_golden() == []


def test_scales_are_split_with_their_kernels(served):
    _, engine = served
    layout = engine.weights_layout()

    def spec(suffix):
        (found,) = [
            v for p, v in layout["variables"].items() if p.endswith(suffix)
        ]
        return found["spec"]

    if len(layout["devices"]) == 1:  # one device holds every variable whole
        total = sum(v["bytes"] for v in layout["variables"].values())
        assert layout["devices"] == [total]
        return
    # A projection into heads: kernel [hidden, heads, head_dim] split over
    # heads, its scale [1, 1, heads, head_dim] too; the MLP's up projection
    # over its columns with its per-column scale; the down projection over
    # its rows, its per-output scale whole; the vocabulary with its scale.
    layer = "transformer_layer_0/"
    assert spec(layer + "self_attention/query/kernel")[1] is not None
    assert spec(layer + "self_attention/query/kernel_scale")[2] is not None
    assert spec(layer + "feedforward_gate_dense/kernel")[1] is not None
    assert spec(layer + "feedforward_gate_dense/kernel_scale")[0] is not None
    assert spec(layer + "feedforward_output_dense/kernel")[0] is not None
    assert not any(spec(layer + "feedforward_output_dense/kernel_scale"))
    assert spec("token_embedding/embeddings_scale")[0] is not None
