"""What the engine fork server imports once (see `engine_process`).

The modules vLLM's engine process imports first: vLLM's engine core,
tpu-inference's runner (through keras-vllm's platform plugin), Keras and
keras-hub, and keras-vllm's model class. Importing them starts no JAX
runtime, so the fork server can fork engine processes afterwards.
"""

import vllm.v1.engine.core  # noqa: F401
import vllm.v1.executor.uniproc_executor  # noqa: F401
import tpu_inference.runner.tpu_runner  # noqa: F401
import keras_hub  # noqa: F401

import keras_vllm.load.vllm_model  # noqa: F401
