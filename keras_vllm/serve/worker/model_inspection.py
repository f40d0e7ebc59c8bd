"""`repr(llm)` of a vLLM engine serving a keras-vllm artifact.

vLLM's `LLM.__repr__` asks each worker for `get_model_inspection()`, which
formats `get_model()` as a PyTorch module tree; tpu-inference's runner
(pinned 0.32.0) has no `get_model`, so showing `engine.llm` in a notebook
raised `AttributeError`. `install()` answers for runners serving an
artifact with the served model's own description
(`KerasVllmForCausalLM.describe`); other models keep vLLM's method.
"""

from keras_vllm import patching


def install():
    """Rebinds tpu-inference's `TPUWorker.get_model_inspection` (idempotent;
    the served model calls it when it loads, in the worker's process, where
    tpu-inference's worker module is imported already)."""
    from tpu_inference.worker.tpu_worker import TPUWorker

    patching.replace(TPUWorker, "get_model_inspection", _describing_ours)


def _describing_ours(original):

    def get_model_inspection(self):
        from keras_vllm.serve.hf_config import serves_artifact

        if serves_artifact(getattr(self, "model_config", None)):
            return self.model_runner.model.describe()
        return original(self)

    return get_model_inspection
