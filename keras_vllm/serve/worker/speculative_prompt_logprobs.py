"""Prompt logprobs on an engine that speculates (n-gram).

tpu-inference 0.32.0's `TPUModelRunner._execute_model` raises
`ValueError("prompt_logprobs is not supported with speculative decoding.")`
for every step that holds a request asking for prompt logprobs when the
engine has a `speculative_config`. It raises in the engine core, so one such
request stops the engine: every request in flight fails, and `vllm serve`
exits.

Nothing in the step needs the refusal. When a request of the step wants
prompt logprobs the runner computes logits for every token of the step
(`full_logits`) and finds each request's rows by its scheduled token count
(`sampling.compute_prompt_logprobs`), which counts a speculating request's
draft tokens too; and a request's prompt logprobs are complete (and it
leaves `input_batch.num_prompt_logprobs`) in the step that ends its prompt,
before the n-gram proposer drafts anything for it.

`install()` lets such steps run on runners serving a keras-vllm artifact:
their `speculative_config` reads None from the end of the step's input
preparation (`_prepare_inputs`, which lays the drafts out; wrapped for the
step only, on the runner object, so that keras-vllm's other replacement of
it, `prompt_lengths.py`, stays in place) until `_execute_model` returns,
whatever happens; the rest of `_execute_model` reads it only for the
refusal. Sampling, rejection and drafting (`sample_tokens`, called after)
see the engine's config as before. Other models keep tpu-inference's
behaviour.
"""

import functools

from keras_vllm import patching

# The runner attribute that holds the hidden config during one step.
_HIDDEN = "_keras_vllm_hidden_speculative_config"


def _restore(runner):
    hidden = runner.__dict__.pop(_HIDDEN, None)
    if hidden is not None:
        runner.speculative_config = hidden


def _step(original):
    @functools.wraps(original)
    def _execute_model(self, *args, **kwargs):
        from keras_vllm.serve.hf_config import serves_artifact

        if self.speculative_config is None or not serves_artifact(
            self.model_config
        ):
            return original(self, *args, **kwargs)
        # For this step only, an instance attribute in front of the class's
        # `_prepare_inputs` (whatever else replaced that one: keras-vllm's
        # prompt lengths do): it hides the config once the drafts are laid.
        prepare = type(self)._prepare_inputs.__get__(self)

        def prepare_then_hide(*inputs, **options):
            result = prepare(*inputs, **options)
            if (
                self.speculative_config is not None
                and self.input_batch.num_prompt_logprobs
            ):
                setattr(self, _HIDDEN, self.speculative_config)
                self.speculative_config = None
            return result

        self._prepare_inputs = prepare_then_hide
        try:
            return original(self, *args, **kwargs)
        finally:
            self.__dict__.pop("_prepare_inputs", None)
            _restore(self)

    return _execute_model


def install():
    """Rebinds the runner's `_execute_model` (idempotent; keras-vllm's vLLM
    plugin calls it in every vLLM process)."""
    from tpu_inference.runner.tpu_runner import TPUModelRunner

    patching.replace(TPUModelRunner, "_execute_model", _step)
