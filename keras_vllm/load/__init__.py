"""Artifact -> models: the Keras loader and (with vLLM) the serving model."""

from keras_vllm.load.keras_loader import load_causal_lm  # noqa: F401
from keras_vllm.load.keras_loader import load_tokenizer  # noqa: F401
