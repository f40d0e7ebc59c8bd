"""`repr(llm)` of a vLLM engine serving a keras-vllm artifact.

vLLM's `LLM.__repr__` asks each worker for `get_model_inspection()`, which
formats `get_model()` as a PyTorch module tree; tpu-inference's runner
(pinned 0.32.0) has no `get_model`, so showing `engine.llm` in a notebook
raised `AttributeError`. `install()` answers for runners serving an
artifact with the served model's own description
(`KerasVllmForCausalLM.describe`); other models keep vLLM's method.
"""

_ORIGINAL = "keras_vllm_original"


def install():
    """Rebinds tpu-inference's `TPUWorker.get_model_inspection` (idempotent;
    keras-vllm's vLLM plugin calls it in every vLLM process)."""
    from tpu_inference.worker.tpu_worker import TPUWorker

    original = TPUWorker.get_model_inspection
    if hasattr(original, _ORIGINAL):
        return

    def get_model_inspection(self):
        from keras_vllm.load.hf_config import serves_artifact

        if serves_artifact(getattr(self, "model_config", None)):
            return self.model_runner.model.describe()
        return original(self)

    setattr(get_model_inspection, _ORIGINAL, original)
    TPUWorker.get_model_inspection = get_model_inspection
