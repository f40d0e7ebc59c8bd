"""tpu-inference's runner, fixed for steps that carry images.

Two behaviours of tpu-inference 0.32.0's `TPUModelRunner` (pinned with the
versions in `keras_vllm.patching.PINNED_VERSIONS`) stand between a
keras-vllm image artifact and `generate()`'s output; `install()` changes
them for runners serving a keras-vllm artifact only:

* `_get_input_ids_embeds` hands the model `input_ids=None` beside the
  merged embeddings on a step with images. The served model needs the ids
  too: they say where each image's placeholders are, which attend to their
  whole image (`keras_vllm.serve.worker.image_model`). The fix passes both.
* `_execute_model` refuses any step of a multimodal model while a request
  asks for prompt logprobs ("prompt_logprobs is not supported for
  multimodal models"). Nothing in the step depends on it: prompt logprobs
  are computed from the step's hidden states like a text model's. The fix
  lowers the runner's multimodal flag between gathering the step's image
  embeddings and merging them (the only place the refusal reads it).
"""

from keras_vllm import patching


def install():
    """Rebinds the runner's methods (idempotent; keras-vllm's vLLM plugin
    calls it in every vLLM process)."""
    from tpu_inference.runner import multimodal_manager
    from tpu_inference.runner import tpu_runner

    patching.replace(
        tpu_runner.TPUModelRunner, "_get_input_ids_embeds", _with_ids
    )
    patching.replace(
        multimodal_manager.MultiModalManager, "gather_mm_embeddings",
        _prompt_logprobs_allowed,
    )


def _serves_artifact(runner):
    from keras_vllm.serve.hf_config import serves_artifact

    return serves_artifact(runner.model_config)


def _with_ids(original):

    def get_input_ids_embeds(self, input_ids, mm_embeds, is_mm_embed):
        if not _serves_artifact(self):
            return original(self, input_ids, mm_embeds, is_mm_embed)
        # Raised again for the rest of the step (see `gather_mm_embeddings`).
        self.is_multimodal_model = getattr(
            self, "_keras_vllm_multimodal", self.is_multimodal_model
        )
        ids, embeds = original(self, input_ids, mm_embeds, is_mm_embed)
        return input_ids, embeds

    return get_input_ids_embeds


def _prompt_logprobs_allowed(original):

    def gather_mm_embeddings(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        runner = self.runner
        if _serves_artifact(runner) and runner.input_batch.num_prompt_logprobs:
            runner._keras_vllm_multimodal = runner.is_multimodal_model
            runner.is_multimodal_model = False
        return out

    return gather_mm_embeddings
