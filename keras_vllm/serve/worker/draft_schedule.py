"""N-gram drafting that steps aside (by batch size, and by acceptance) and
looks up the tokens a step just sampled.

A verify step costs more than a plain one (it runs the drafts through the
model too: 1.7-1.8x a plain step on a TPU v5e at the bench's 128M model,
2.3-4x on a 2-core CPU host at its tiny one, 4 drafts a step), so drafts
pay only where enough of them are accepted and the batch is small enough
that the extra tokens are nearly free. Two settings make
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
  `--additional-config` on the command line): when the engine's last
  `WINDOW_STEPS` verify steps accepted less than RATE (0 to 1) of the
  tokens drafted in them, nobody drafts for `PAUSE_STEPS` steps, then
  drafting resumes (text may start repeating later).

A step in which no request has drafts is run as a plain step. tpu-inference
0.32.0 lays out every step of an engine with a `speculative_config` for
verification (`TPUModelRunner._prepare_inputs` builds `SpecDecodeMetadata`
with draft lengths of 0, the sampler runs the rejection path, and
`extract_last_sampled_tokens` runs on the device after it; on a CPU host,
profiled at concurrency 32, building that metadata alone took ~1.7 ms of a
~15 ms step). So for n-gram (whose host-side drafter reads only the
step's sampled tokens) with synchronous scheduling (vLLM turns async off
with n-gram), `_prepare_inputs` runs with the config hidden in such steps,
and `extract_last_sampled_tokens` of a plain step returns nothing (no
caller reads it for n-gram).

For a keras-vllm artifact the n-gram lookup also reads the tokens the
step just sampled (`_propose_after`): tpu-inference 0.32.0 drafts before it
appends them, so its drafts lagged a step and, on text that repeats with a
period above one token, were all rejected.

`install()` wraps the n-gram branch of `propose_draft_token_ids` and
`_prepare_inputs` for runners serving a keras-vllm artifact;
`extract_last_sampled_tokens` only changes for steps that have no metadata,
which only those runners make. Other models keep tpu-inference's behaviour.
"""

import functools
import inspect

from keras_vllm import patching

# The `additional_config` key of the acceptance floor.
MIN_ACCEPTANCE_KEY = "min_draft_acceptance"
# Verify steps the engine's acceptance is judged over, and steps nobody
# then drafts in before drafting resumes.
WINDOW_STEPS = 4
PAUSE_STEPS = 32


class AcceptanceGate:
    """The engine's drafted and accepted tokens over its last verify steps,
    and the steps left in a pause.

    A step that verifies drafts for any request costs about what it costs
    when every request drafted (the step computes their tokens and runs the
    rejection sampler for all), so the gate judges the whole batch's
    acceptance and pauses everyone's drafts: paused steps are plain steps.

    Args:
        min_acceptance: the floor, accepted / drafted tokens (0 to 1).
        window_steps: verify steps judged at once.
        pause_steps: steps without drafts after a window below the floor.

    Example:

    ```python
    gate = AcceptanceGate(0.5, window_steps=1)
    gate.record(["a"], {"a": [7, 7, 7, 7]}, [[3]])  # none of 4 accepted
    gate.allows()  # False: the next 32 steps draft nothing
    ```
    """

    def __init__(self, min_acceptance, window_steps=WINDOW_STEPS,
                 pause_steps=PAUSE_STEPS):
        self.min_acceptance = float(min_acceptance)
        self.window_steps = window_steps
        self.pause_steps = pause_steps
        self._steps = self._drafted = self._accepted = 0
        self._paused = 0

    def record(self, req_ids, scheduled_drafts, sampled):
        """Counts one step's outcome: `sampled[i]` holds the tokens the step
        gave `req_ids[i]` (its accepted drafts and one more), for the drafts
        `scheduled_drafts[req_id]` the step verified."""
        drafted = accepted = 0
        for req_id, tokens in zip(req_ids, sampled):
            drafts = len(scheduled_drafts.get(req_id, ()))
            if drafts and tokens:
                drafted += drafts
                accepted += min(len(tokens) - 1, drafts)
        if not drafted:
            return
        self._steps += 1
        self._drafted += drafted
        self._accepted += accepted
        if self._steps >= self.window_steps:
            if self._accepted < self.min_acceptance * self._drafted:
                self._paused = self.pause_steps
            self._steps = self._drafted = self._accepted = 0

    def allows(self):
        """Whether this step may draft (counts a paused step down)."""
        if not self._paused:
            return True
        self._paused -= 1
        return False


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


def _propose_after(runner, count, sampled):
    """The n-gram drafts of `count` tokens for each request, looked up in its
    tokens up to and including `sampled`, those this step gave it.

    tpu-inference 0.32.0 drafts before it appends the step's tokens to the
    input batch (`TPUModelRunner._sample_from_logits`), so its lookup ran a
    step behind: each draft continued the text before the tokens just
    sampled and, on text repeating with a period above one token, was
    rejected (vLLM's GPU runner appends first). The tokens go where the
    runner writes them next (the same values) and the lookup reads up to
    the lengths they will give.
    """
    import numpy as np

    batch = runner.input_batch
    lengths = np.array(batch.num_tokens_no_spec, copy=True)
    room = batch.token_ids_cpu.shape[1]
    for index, tokens in enumerate(sampled):
        start = int(lengths[index])
        end = min(start + len(tokens), room)
        batch.token_ids_cpu[index, start:end] = tokens[: end - start]
        lengths[index] = end
    return runner.drafter.propose(count, sampled, lengths, batch.token_ids_cpu)


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
        num_reqs = runner.input_batch.num_reqs
        req_ids = list(runner.input_batch.req_ids[:num_reqs])
        if count <= 0:
            # The schedule says none at this batch size: no lookup, and
            # the next step is a plain one.
            self._draft_token_ids = [[] for _ in req_ids]
            return None
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        sampled = None
        if gate is not None and any(scheduled.values()):
            sampled = _sampled_tokens(runner, arguments)[:num_reqs]
            gate.record(req_ids, scheduled, sampled)
        if gate is not None and not gate.allows():
            self._draft_token_ids = [[] for _ in req_ids]
            return None
        if sampled is None:
            sampled = _sampled_tokens(runner, arguments)[:num_reqs]
        drafts = _propose_after(runner, count, sampled)
        self._draft_token_ids = [list(d[:count]) for d in drafts]
        return None

    return propose_draft_token_ids


def _undrafted_ngram_step(runner, scheduler_output):
    """Whether `runner`'s step has no drafts to verify and can run plain."""
    from keras_vllm.serve.hf_config import serves_artifact

    config = runner.speculative_config
    return (
        config is not None
        and config.method == "ngram"
        and not runner.scheduler_config.async_scheduling
        and not any(scheduler_output.scheduled_spec_decode_tokens.values())
        and serves_artifact(runner.model_config)
    )


def _plain_when_undrafted(original):
    @functools.wraps(original)
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        if not _undrafted_ngram_step(self, scheduler_output):
            return original(self, scheduler_output, *args, **kwargs)
        config = self.speculative_config
        self.speculative_config = None
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = config

    return _prepare_inputs


def _nothing_for_plain_steps(original):
    @functools.wraps(original)
    def extract_last_sampled_tokens(spec_decode_metadata, *args, **kwargs):
        if spec_decode_metadata is None:
            return None, None
        return original(spec_decode_metadata, *args, **kwargs)

    return extract_last_sampled_tokens


def install():
    """Rebinds tpu-inference's `propose_draft_token_ids`, `_prepare_inputs`
    and the runner's `extract_last_sampled_tokens` (idempotent; keras-vllm's
    vLLM plugin calls it in every vLLM process)."""
    from tpu_inference.runner import tpu_runner
    from tpu_inference.runner.speculative_decoding_manager import (
        SpeculativeDecodingManager,
    )

    patching.replace(
        SpeculativeDecodingManager, "propose_draft_token_ids", _scheduled
    )
    patching.replace(
        tpu_runner.TPUModelRunner, "_prepare_inputs", _plain_when_undrafted
    )
    patching.replace(
        tpu_runner, "extract_last_sampled_tokens", _nothing_for_plain_steps
    )
