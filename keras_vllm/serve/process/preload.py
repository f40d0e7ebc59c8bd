"""What the engine fork server imports once (see `keras_vllm.serve.process.start`).

The modules vLLM's engine process imports first: vLLM's engine core,
tpu-inference's runner (through keras-vllm's platform plugin), Keras and
keras-hub, and keras-vllm's model class. Importing them starts no JAX
runtime, so the fork server can fork engine processes afterwards.
"""

import gc

from keras_vllm.cpu import detect

# The process that starts the fork server has said that the CPU backend is
# on; the server is a fresh interpreter and would say it again.
detect.announced_elsewhere()

import vllm.v1.engine.core  # noqa: E402, F401
import vllm.v1.executor.uniproc_executor  # noqa: E402, F401
import tpu_inference.runner.tpu_runner  # noqa: E402, F401
from keras_vllm.hub import imports  # noqa: E402

imports.import_keras_hub()

import keras_vllm.serve.worker.model  # noqa: E402, F401

# The engine processes forked from the server share these modules' memory;
# frozen, their objects are skipped by each child's first full collection
# (vLLM's `freeze_gc_heap`) instead of being copied page by page.
gc.freeze()
