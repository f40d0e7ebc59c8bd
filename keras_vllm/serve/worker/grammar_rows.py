"""Each structured-output request gets its own grammar's token mask.

vLLM's scheduler sends one row of grammar bitmask per structured-output
request, in the order of `GrammarOutput.structured_output_request_ids`
("The corresponding rows of the bitmask will be in this order",
vllm/v1/core/sched/scheduler.py). tpu-inference 0.32.0's
`StructuredDecodingManager.prepare_structured_decoding_input` walks those
ids *sorted* instead, so as soon as two structured requests of one step
sort differently from their scheduling order (ids "9-..." and "10-...", or
the random ids of `vllm serve`'s requests) each gets another request's
mask: it samples tokens its grammar rejects, and vLLM ends it with
"grammar rejected tokens" (finish reason `error`). A request alone in its
step, or ids that happen to sort in order, are unaffected, which is why
single requests looked fine.

`install()` rebinds that method (pinned with the versions in
`keras_vllm.patching.PINNED_VERSIONS`) for runners serving a keras-vllm
artifact: row `i` of the bitmask goes to the `i`-th listed request's batch
slot. Other models keep tpu-inference's method; speculative decoding
(several rows per request, never used with keras-vllm models) too.
"""

from keras_vllm import patching


def fill_rows(runner, grammar_output):
    """Writes the step's bitmask rows into `runner`'s per-slot arrays, in
    the order vLLM lists the requests (slots without a structured request
    stay unconstrained)."""
    runner.grammar_bitmask_cpu.fill(0)
    runner.require_structured_out_cpu.fill(0)
    slot_of = runner.input_batch.req_id_to_index
    bitmask = grammar_output.grammar_bitmask
    for row, req_id in enumerate(grammar_output.structured_output_request_ids):
        slot = slot_of.get(req_id)
        if slot is None:  # finished or preempted since it was scheduled
            continue
        runner.grammar_bitmask_cpu[slot] = bitmask[row]
        runner.require_structured_out_cpu[slot] = True


def install():
    """Rebinds tpu-inference's bitmask preparation (idempotent; keras-vllm's
    vLLM plugin calls it in every vLLM process)."""
    from tpu_inference.runner import structured_decoding_manager as module

    patching.replace(
        module.StructuredDecodingManager,
        "prepare_structured_decoding_input",
        lambda original: _one_row_each(module, original),
    )


def _one_row_each(module, original):

    def prepare_structured_decoding_input(self, logits, grammar_output):
        from keras_vllm.serve.hf_config import serves_artifact

        runner = self.runner
        one_row_each = len(grammar_output.grammar_bitmask) == len(
            grammar_output.structured_output_request_ids
        )
        if not (one_row_each and serves_artifact(runner.model_config)):
            return original(self, logits, grammar_output)
        fill_rows(runner, grammar_output)
        num_reqs = logits.shape[0]
        return module.device_array(
            runner.mesh,
            (
                runner.require_structured_out_cpu[:num_reqs],
                runner.grammar_bitmask_cpu[:num_reqs],
                runner.structured_decode_arange,
            ),
        )

    return prepare_structured_decoding_input
