"""Golden outputs recorded in one batched call equal the per-prompt ones.

Export and `verify` run every golden prompt through one compiled call
(`reference.greedy_batch`, right-padded to one shape) instead of one
`generate()` per prompt. These tests hold it to the per-prompt references
it replaced: a rotary family, one with a learned position embedding (where
a wrong position offset would show) and GPT-NeoX's forward-pass reference.
"""

import pytest

from keras_vllm.hub import reference
from keras_vllm import testing
from helpers.trained_models import trained

NEW_TOKENS = 12

# Prompts of different lengths, so rows carry different amounts of padding.
PROMPTS = testing.prompts()[:2] + ["the"]


def _prompt_ids(causal_lm):
    return [reference.prompt_token_ids(causal_lm, text) for text in PROMPTS]


def _cut(row, stop):
    return row[: row.index(stop) + 1] if stop in row else row


@pytest.mark.parametrize(
    "family, name",
    [
        ("gpt2", "generate"),
        ("llama", "generate"),
        ("gpt_neo_x", "forward_pass"),
    ],
)
def test_batched_record_equals_per_prompt(family, name):
    causal_lm = trained(family)
    prompts = _prompt_ids(causal_lm)
    assert len({len(ids) for ids in prompts}) > 1
    per_prompt = reference.greedy_by(name)
    free = [per_prompt(causal_lm, ids, NEW_TOKENS, []) for ids in prompts]
    assert reference.greedy_batch(causal_lm, prompts, NEW_TOKENS, [], name) == (
        free
    )
    # A stop token that ends one row early (mid-output) must end only that
    # row, and be kept as its last token. Greedy decoding makes the
    # per-prompt result with a stop the free one cut after the stop.
    stop = free[0][4]
    stopped = [_cut(row, stop) for row in free]
    assert len(stopped[0]) == 5
    assert reference.greedy_batch(
        causal_lm, prompts, NEW_TOKENS, [stop], name
    ) == stopped


def test_unknown_reference_name_is_refused():
    with pytest.raises(KeyError):
        reference.greedy_batch(None, [[1]], 4, [], "beam")

