"""Artifact -> Keras objects, and every check a reader runs before building.

Imports no vLLM: the served model is `keras_vllm.serve.worker.model`.
"""

from keras_vllm.load.keras_loader import load_causal_lm  # noqa: F401
from keras_vllm.load.keras_loader import load_tokenizer  # noqa: F401
