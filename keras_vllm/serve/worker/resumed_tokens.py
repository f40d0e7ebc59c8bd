"""A request that comes back to the batch continues from its real tokens.

With async scheduling (vLLM's default), tpu-inference's runner writes a
placeholder (0) for each token it has sampled but not yet copied back, and
swaps the real token in one step later, but only for requests still in its
persistent batch ("If request not active in the *current* batch (e.g.
finished or evicted), skip it", tpu-inference 0.32.0
`TPUModelRunner._modify_prev_results`). A request that
leaves the batch meanwhile (preempted when the KV cache runs short, or
simply not scheduled for a step) keeps the placeholder in its cached
output tokens; when it is scheduled again its recomputed prefill feeds 0
where its last token was, and every later token is computed from that
wrong context. Measured: a 300-token prompt beside six prompts sharing a
200-token prefix, 20 KV blocks, async scheduling: one request's greedy
output left `generate()`'s at its 17th token (to a token outside the
reference's top 3), the same on tpu-inference's own Llama; exact without
async scheduling, or with blocks enough.

vLLM's scheduler sends the full token list of every request that was not
in the previous step (`CachedRequestData.all_token_ids`), and vLLM's own
GPU runner restores a returning request's output tokens from it.
`install()` does the same before tpu-inference's
`PersistentBatchManager.update_states` (pinned with the versions in
`keras_vllm.patching.PINNED_VERSIONS`), for runners serving a keras-vllm
artifact; other models keep tpu-inference's method.
"""

from keras_vllm import patching


def restore_outputs(requests, cached_requests):
    """Sets each returning request's cached output tokens to the scheduler's.

    Args:
        requests: the runner's `CachedRequestState`s by request id.
        cached_requests: the step's `CachedRequestData`. Its
            `all_token_ids` holds the tokens (prompt and outputs) of every
            scheduled request that was not in the previous step.

    Returns:
        The ids of the requests whose output tokens were replaced.
    """
    all_token_ids = getattr(cached_requests, "all_token_ids", None) or {}
    restored = []
    for req_id, count in zip(
        cached_requests.req_ids, cached_requests.num_output_tokens
    ):
        tokens = all_token_ids.get(req_id)
        state = requests.get(req_id)
        if count <= 0 or tokens is None or state is None:
            continue
        outputs = [int(t) for t in tokens[-count:]]
        if state.output_token_ids != outputs:
            # In place: a batch row may still refer to this list.
            state.output_token_ids[:] = outputs
            restored.append(req_id)
    return restored


def install():
    """Rebinds tpu-inference's batch update (idempotent; keras-vllm's vLLM
    plugin calls it in every vLLM process)."""
    from tpu_inference.runner import persistent_batch_manager as module

    patching.replace(
        module.PersistentBatchManager, "update_states", _restoring
    )


def _restoring(original):

    def update_states(self, scheduler_output, *args, **kwargs):
        from keras_vllm.serve.hf_config import serves_artifact

        if serves_artifact(self.model_config):
            restore_outputs(
                self.requests, scheduler_output.scheduled_cached_reqs
            )
        return original(self, scheduler_output, *args, **kwargs)

    return update_states
