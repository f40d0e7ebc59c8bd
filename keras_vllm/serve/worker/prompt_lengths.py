"""Each token's prompt length, for the layers that read it.

Phi-3's "su" RoPE (`keras_vllm/layers/phi3.py`) rotates every token of a
prompt longer than the pretraining length with its long factors, as Keras
does when it prefills the prompt in one call. When vLLM prefills such a
prompt in chunks (a step's token budget, `max_num_batched_tokens`, shared
with other requests), a chunk that ends before that length needs the
prompt's length, which vLLM's attention metadata does not carry (its
`seq_lens` end at the step).

tpu-inference 0.32.0's runner (pinned with the versions in
`keras_vllm.patching.PINNED_VERSIONS`) hands the model its positions twice:
in the attention metadata, and as `input_positions` (for M-RoPE models);
keras-vllm's models read the metadata's. For a served model that asks for
prompt lengths (`KerasVllmForCausalLM.uses_prompt_lengths`), `install()`
makes `TPUModelRunner._prepare_inputs` return each token's request's prompt
length (vLLM's `num_prompt_tokens`) in that place, laid out as the tokens
are (a block per data-parallel rank, padding 0), with the positions' shape,
dtype and sharding: the programs compiled at warm-up (positions there)
serve every step. A step where every token decodes keeps the positions
(tpu-inference's continue-decode loop advances them on the device); the
layers read either the same way (`ServingContext.prompt_lengths`).
"""

import numpy as np

from keras_vllm import patching


def token_prompt_lengths(batch, num_scheduled_tokens, req_ids_dp, size):
    """Each scheduled token's request's prompt length.

    Args:
        batch: the runner's `InputBatch` (before this step is computed).
        num_scheduled_tokens: `{request id: tokens this step}`.
        req_ids_dp: `{data-parallel rank: [request id]}` in the order the
            runner lays out the step's tokens.
        size: the step's padded token count (all ranks).

    Returns:
        `int32[size]`, or None when no scheduled request is still in its
        prompt.
    """
    lengths = np.zeros(size, np.int32)
    block = size // max(len(req_ids_dp), 1)
    prefilling = False
    for rank, req_ids in req_ids_dp.items():
        offset = block * rank
        for req_id in req_ids:
            count = int(num_scheduled_tokens[req_id])
            index = batch.req_id_to_index[req_id]
            prompt = int(batch.num_prompt_tokens[index])
            prefilling |= int(batch.num_computed_tokens_cpu[index]) < prompt
            lengths[offset:offset + count] = prompt
            offset += count
    return lengths if prefilling else None


def install():
    """Rebinds the runner's input preparation (idempotent; keras-vllm's
    vLLM plugin calls it in every vLLM process)."""
    from tpu_inference.runner import tpu_runner

    patching.replace(
        tpu_runner.TPUModelRunner, "_prepare_inputs", _with_prompt_lengths
    )


def _with_prompt_lengths(original):

    def prepare_inputs(self, scheduler_output):
        prepared = original(self, scheduler_output)
        if not getattr(self.model, "uses_prompt_lengths", False):
            return prepared
        import jax

        # (input_ids, positions, attention metadata, ..., req_ids_dp, ...)
        positions, req_ids_dp = prepared[1], prepared[8]
        lengths = token_prompt_lengths(
            self.input_batch, scheduler_output.num_scheduled_tokens,
            req_ids_dp, positions.shape[0],
        )
        if lengths is None:
            return prepared
        lengths = jax.device_put(lengths, positions.sharding)
        return (prepared[0], lengths) + tuple(prepared[2:])

    return prepare_inputs
