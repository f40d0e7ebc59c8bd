"""MTP speculation: a Gemma 4 target served with its assistant drafting
(`keras_vllm/serve/worker/assistant_model.py` on tpu-inference's MTP
proposer; export and refusals without an engine:
`tests/export/test_assistant_export.py`, `test_speculation.py`).

One engine for the module: the trained `gemma4_e2b` target (shared with
the family modules' fine-tune) and a tiny assistant with a centroid head
distilled from it (~10 s), exported both, 3 drafts a step. About 95 s here: the setup
(distillation 10 s, exports, engine start) ~58 s, the greedy check 25 s
(with the Keras references' compiles), prompt logprobs 5 s.
"""

import pytest

import keras_vllm
from helpers import engine_shapes
from helpers import serving_checks
from helpers.trained_models import trained
from keras_vllm import testing
from keras_vllm.testing.assistants import fine_tune_assistant

FAMILY = "gemma4_e2b"
DRAFTS = 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    target = trained(FAMILY)
    # A centroid head, as the E2B / E4B assistants have (scoring every
    # token: `build_tiny_assistant`).
    assistant = testing.build_tiny_assistant(target, ordered_embeddings=True)
    fine_tune_assistant(assistant, target, steps=600)
    root = tmp_path_factory.mktemp("mtp")
    target_path = target.export_vllm(
        root / "target", max_sequence_length=256,
        golden_prompts=testing.prompts()[:2],
    )
    assistant_path = keras_vllm.export_assistant(
        assistant, root / "assistant", target=target_path
    )
    engine = keras_vllm.KerasVllmEngine.from_export(
        target_path,
        **engine_shapes.ENGINE_KWARGS,
        speculative_config={
            "method": "mtp",
            "model": str(assistant_path),
            "num_speculative_tokens": DRAFTS,
        },
        per_request_spec_decode_metrics="summary",
    )
    yield target, engine
    serving_checks.shutdown(engine)


def test_greedy_matches_generate_with_assistant_drafts(served):
    """The target's own tokens, with the assistant's drafts verified
    several a step: steps that rejected every draft, steps that accepted
    all 3 (the assistant's later drafts, fed its own projected state, are
    right too) and, over the batch, a measured acceptance (a third of the
    drafted tokens on this fixture when written: 140 of 420)."""
    target, engine = served
    outputs = serving_checks.check_greedy_matches_generate(engine, target)
    metrics = [o.outputs[0].spec_decode_metrics for o in outputs]
    histograms = [m.histogram for m in metrics]
    assert sum(h[0] for h in histograms) > 0, histograms
    assert sum(h[DRAFTS] for h in histograms) > 0, histograms
    accepted = sum(i * n for h in histograms for i, n in enumerate(h))
    drafted = sum(m.num_draft_tokens for m in metrics)
    # Shown with `pytest -s`: the figure docs/HANDOFF.md quotes.
    print(f"MTP acceptance: {accepted} of {drafted} drafted tokens, "
          f"{len(metrics)} requests, histograms {histograms}")
    assert accepted / drafted > 0.2, (accepted, drafted, histograms)


def test_prompt_logprobs_match_forward_pass(served):
    target, engine = served
    serving_checks.check_prompt_logprobs(engine, target)
