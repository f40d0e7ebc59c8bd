"""n-gram speculation on a model with recurrent-state layers, exactly.

A tiny Qwen 3.5 (Gated DeltaNet layers beside full attention) fine-tuned on
a repeating sentence, served with n-gram drafting: verify steps run up to
four drafted tokens through the linear-attention layers, and each
request's next step must read the state of its last accepted token
(`gated_delta_rule.conv1d_gdn_windowed`: a state per draft position).
Most drafts are accepted; prompts that break the cycle make the lookup
draft wrong tokens, one of them at every step, so rejected drafts pass
through the state all along (with one state slot a request, as before
#61, that prompt's greedy tokens differ from Keras': checked by hand).
Greedy tokens must be Keras' (greedy decoding by the forward pass, as
`family_serving.REFERENCE` has it for Qwen 3.5). The family checks serve the
tiny Qwen 3.5 models speculating too (`family_serving.SPECULATIVE`).

Cost: ~100 s (fine-tune and engine start ~60 s, requests and the
reference ~25 s).
"""

import pytest

from helpers import family_serving
from helpers import serving_checks
from keras_vllm import testing
from keras_vllm.hub import reference

CYCLE = "one two three four five"
NEW_TOKENS = 24
PROMPTS = [
    f"{CYCLE} one two three",
    f"{CYCLE} {CYCLE} one",
    # The cycle broken once: the lookup drafts "seven ..." after "two
    # three", the model continues with "four".
    "one two three seven one two three four five one two three",
    # Each 4-gram of the cycle first followed by a wrong word: the lookup
    # (earliest longest match) drafts a wrong token first every step.
    "one two three four six two three four five seven three four five one "
    "eight four five one two nine five one two three ten one two three "
    "four five one",
    "one two three the quick brown fox jumps over the lazy dog four five "
    "one two three",
    testing.prompts()[0],
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = testing.build_tiny_causal_lm("qwen3_5")
    testing.fine_tune(
        model, steps=120, texts=[" ".join([CYCLE] * 5)] * 4,
        learning_rate=1e-2,
    )
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp("hybrid") / "artifact",
        max_num_seqs=4, max_num_batched_tokens=32,
        **family_serving.SPECULATIVE,
    )
    yield model, engine
    serving_checks.shutdown(engine)


def test_drafts_through_recurrent_state_keep_greedy_output(served):
    from vllm import SamplingParams

    model, engine = served
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    outputs = engine.generate(PROMPTS, params)
    mismatches = []
    for text, out in zip(PROMPTS, outputs):
        want = reference.greedy_by_forward_pass(
            model, out.prompt_token_ids, NEW_TOKENS, stop_token_ids=()
        )
        got = list(out.outputs[0].token_ids)
        if got != list(want):
            mismatches.append((text, list(want), got))
    assert not mismatches, mismatches
    family_serving.check_drafts_verified(outputs, accepted=True)
