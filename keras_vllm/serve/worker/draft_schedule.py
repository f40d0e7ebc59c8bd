"""N-gram drafting that steps aside: by batch size, and by acceptance.

A verify step costs more than a plain one (it runs the drafts through the
model too: 1.3-2.4x on a CPU host, 1.7-1.8x on a TPU v5e at the bench's
sizes), so drafts pay only where enough of them are accepted and the batch
is small enough that the extra tokens are nearly free. Two settings make
n-gram drafting step aside where it would not pay; neither changes what is
generated (a step without drafts is a plain step, and speculation is exact):

- vLLM's own batch-size schedule, `speculative_config`'s
  `num_speculative_tokens_per_batch_size`: `[[first, last, tokens], ...]`,
  inclusive ranges of the step's batch size (requests in it) and the tokens
  to draft there, 0 for none, e.g. `[[1, 8, 4], [9, 1024, 0]]`. vLLM's
  scheduler writes the count into `SchedulerOutput.num_spec_tokens_to_schedule`
  and vLLM's GPU runner drafts that many; tpu-inference 0.32.0's
  `SpeculativeDecodingManager.propose_draft_token_ids` always drafts
  `num_speculative_tokens`, so without this module the setting is accepted
  and does nothing.
- keras-vllm's `additional_config={"min_draft_acceptance": RATE}` (JSON in
  `--additional-config` on the command line): a request whose last
  `WINDOW_STEPS` verify steps accepted less than RATE of its drafted tokens
  (0 to 1) stops drafting for `PAUSE_STEPS` steps, then drafts again (text
  may start repeating later).

`install()` wraps the n-gram branch of `propose_draft_token_ids` for runners
serving a keras-vllm artifact; other models keep tpu-inference's behaviour.
"""

import functools
import inspect

from keras_vllm import patching

# The `additional_config` key of the acceptance floor.
MIN_ACCEPTANCE_KEY = "min_draft_acceptance"
# Verify steps a request's acceptance is judged over, and steps it then
# drafts nothing for before trying again.
WINDOW_STEPS = 4
PAUSE_STEPS = 32

# `propose_draft_token_ids`'s positional index of `scheduler_output`.
_SCHEDULER_OUTPUT = 9


class AcceptanceGate:
    """Per request: drafted and accepted tokens over its last verify steps,
    and the steps left in a pause.

    Args:
        min_acceptance: the floor, accepted / drafted tokens (0 to 1).
        window_steps: verify steps judged at once.
        pause_steps: steps without drafts after a window below the floor.

    Example:

    ```python
    gate = AcceptanceGate(0.5)
    gate.record(["a"], {"a": [7, 7, 7, 7]}, [[3]])  # none of 4 accepted
    gate.allows("a")  # True until a whole window is below 0.5
    ```
    """

    def __init__(self, min_acceptance, window_steps=WINDOW_STEPS,
                 pause_steps=PAUSE_STEPS):
        self.min_acceptance = float(min_acceptance)
        self.window_steps = window_steps
        self.pause_steps = pause_steps
        # req_id -> [verify steps, drafted, accepted, pause steps left]
        self._requests = {}

    def record(self, req_ids, scheduled_drafts, sampled):
        """Counts one step's outcome: `sampled[i]` holds the tokens the step
        gave `req_ids[i]` (its accepted drafts and one more), for the drafts
        `scheduled_drafts[req_id]` the step verified."""
        for req_id, tokens in zip(req_ids, sampled):
            drafts = len(scheduled_drafts.get(req_id, ()))
            if not drafts or not tokens:
                continue
            state = self._requests.setdefault(req_id, [0, 0, 0, 0])
            state[0] += 1
            state[1] += drafts
            state[2] += min(len(tokens) - 1, drafts)
            if state[0] >= self.window_steps:
                if state[2] < self.min_acceptance * state[1]:
                    state[3] = self.pause_steps
                state[:3] = [0, 0, 0]

    def allows(self, req_id):
        """Whether `req_id` may draft this step (counts down a pause)."""
        state = self._requests.get(req_id)
        if state is None or not state[3]:
            return True
        state[3] -= 1
        return False

    def forget(self, req_ids):
        for req_id in req_ids:
            self._requests.pop(req_id, None)


def _gate(manager, runner):
    """The manager's gate, built on first use; None without a floor."""
    gate = getattr(manager, "_keras_vllm_gate", False)
    if gate is False:
        config = getattr(runner.vllm_config, "additional_config", None) or {}
        floor = config.get(MIN_ACCEPTANCE_KEY)
        gate = AcceptanceGate(floor) if floor else None
        manager._keras_vllm_gate = gate
    return gate


def _sampled_tokens(runner, arguments):
    """The tokens this step gave each request, on the host (tpu-inference's
    own extraction, as its n-gram branch does it)."""
    from tpu_inference.runner import utils

    return utils.host_extract_sampled_tokens(
        runner, arguments["spec_decode_metadata"],
        arguments["sampled_output"], arguments["logits_indices_selector"],
        arguments["discard_sampled_tokens_req_indices"],
        runner.input_batch.num_reqs,
    )


def _scheduled(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        from keras_vllm.serve.hf_config import serves_artifact

        runner = self.runner
        config = runner.speculative_config
        arguments = signature.bind(self, *args, **kwargs).arguments
        scheduler_output = arguments.get("scheduler_output")
        if (
            config.method != "ngram"
            or scheduler_output is None
            or not serves_artifact(runner.model_config)
        ):
            return original(self, *args, **kwargs)
        gate = _gate(self, runner)
        count = config.num_speculative_tokens
        if config.uses_dynamic_speculative_decoding():
            count = min(count, scheduler_output.num_spec_tokens_to_schedule)
        if gate is None and count == config.num_speculative_tokens:
            return original(self, *args, **kwargs)
        num_reqs = runner.input_batch.num_reqs
        req_ids = list(runner.input_batch.req_ids[:num_reqs])
        if gate is not None:
            gate.forget(scheduler_output.finished_req_ids)
        if count <= 0:
            # The schedule says none at this batch size: no lookup, and
            # the next step is a plain one.
            self._draft_token_ids = [[] for _ in req_ids]
            return None
        sampled = _sampled_tokens(runner, arguments)[:num_reqs]
        if gate is not None:
            gate.record(
                req_ids, scheduler_output.scheduled_spec_decode_tokens, sampled
            )
        drafts = runner.drafter.propose(
            count, sampled, runner.input_batch.num_tokens_no_spec,
            runner.input_batch.token_ids_cpu,
        )
        self._draft_token_ids = [
            list(d[:count]) if gate is None or gate.allows(r) else []
            for r, d in zip(req_ids, drafts)
        ]
        return None

    return propose_draft_token_ids


def install():
    """Rebinds tpu-inference's `propose_draft_token_ids` (idempotent;
    keras-vllm's vLLM plugin calls it in every vLLM process)."""
    from tpu_inference.runner.speculative_decoding_manager import (
        SpeculativeDecodingManager,
    )

    patching.replace(
        SpeculativeDecodingManager, "propose_draft_token_ids", _scheduled
    )
