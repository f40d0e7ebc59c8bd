"""Keras models converted from Hugging Face checkpoints compute what
transformers computes.

For every family keras-hub converts and keras-vllm serves (the tiny
checkpoints of `helpers/hf_checkpoints.py`, shared with the other Hugging
Face tests of the session): transformers' own greedy continuation of a
64-token prompt (`generate()`, 16 new tokens), then both models' logprobs
over the whole 80 tokens, teacher-forced: within 1e-4 at every position,
and the same top token at every position (transformers' greedy tokens
included) unless transformers' top two are within 1e-4 of a tie. 80 tokens
reach past every fixture's sliding window (16, Gemma 2 and 3: 64).

No engine: the engine serves the Keras model exactly (tested per family
elsewhere), so this is the last step from a served Hugging Face checkpoint
to transformers. What it found: keras-hub's GPT-OSS windows and window
length, Mistral's float16 rounding and Qwen3's query/key norm epsilon
(fixed: `keras_vllm/layers/gpt_oss_hf_fixes.py`, `mistral_hf_fixes.py`,
`qwen3_fixes.py`).

The checkpoints are transformers' random initialisation: their logprobs
move by 0.4 to 1.1 with the prompt across positions, while some families'
greedy continuations repeat one token.

Cost: about 110 s on a 2-core host with a cold XLA cache (one compiled
Keras forward pass per family, Qwen 3.5 and 3.5-MoE about 40 s each, reused
from the serving tests' logprob checks through the run's compile cache;
transformers' generate about 1 s a family); checkpoints are written once
per session.
"""

import numpy as np
import pytest

from helpers import hf_checkpoints
from keras_vllm.hub import reference

PROMPT_LENGTH = 64
NEW_TOKENS = 16
ATOL = 1e-4


def _transformers_model(directory, family):
    import torch
    import transformers

    kwargs = {}
    if family == "gpt_oss":
        # As published: MXFP4 experts, which transformers runs dequantized
        # on a host without its MXFP4 kernels.
        kwargs["quantization_config"] = transformers.Mxfp4Config(
            dequantize=True
        )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", **kwargs
    )
    # transformers 5.19 dequantizes MXFP4 experts to bfloat16 whatever
    # `dtype` asks (`integrations/mxfp4.py::convert_moe_packed_tensors`),
    # and its grouped expert matmul then casts the float32 activations to
    # bfloat16: ~2e-3 from the float32 model at every position, the first
    # included. The dequantized values are exact in both dtypes (bit-equal
    # to keras-hub's); the model in float32 is the checkpoint's.
    return model.float().eval()


def _transformers_greedy(model, prompt):
    import torch

    # No end token: the continuation has NEW_TOKENS tokens.
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        ids = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )[0].tolist()
    assert ids[: len(prompt)] == prompt and len(ids) == len(prompt) + NEW_TOKENS
    return ids


def _transformers_logprobs(model, ids):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


@pytest.mark.parametrize("family", hf_checkpoints.FAMILIES)
def test_converted_model_computes_what_transformers_computes(
    family, hf_checkpoint_root
):
    from keras_vllm.export.capabilities import preset_causal_lm_class

    directory = hf_checkpoints.cached_checkpoint(hf_checkpoint_root, family)
    model = _transformers_model(directory, family)
    vocabulary = model.config.get_text_config().vocab_size
    prompt = np.random.default_rng(0).integers(
        0, vocabulary, PROMPT_LENGTH
    ).tolist()
    ids = _transformers_greedy(model, prompt)
    want = _transformers_logprobs(model, ids)

    causal_lm = preset_causal_lm_class(directory).from_preset(directory)
    got = reference.teacher_forced_logprobs(causal_lm, ids)
    assert got.shape == want.shape

    difference = np.abs(got - want).max(axis=-1)
    assert difference.max() <= ATOL, (
        f"{family}: logprobs differ by up to {difference.max():.2e} "
        f"(position {difference.argmax()} of {len(ids)})"
    )
    # The top token everywhere, transformers' greedy tokens included
    # (row i predicts token i + 1), except within ATOL of a tie.
    top_two = np.sort(want, axis=-1)[:, -2:]
    decided = top_two[:, 1] - top_two[:, 0] > 2 * ATOL
    agree = got.argmax(-1) == want.argmax(-1)
    assert agree[decided].all(), np.flatnonzero(decided & ~agree)
    greedy = want.argmax(-1)[PROMPT_LENGTH - 1 : -1]
    assert greedy.tolist() == ids[PROMPT_LENGTH:]
