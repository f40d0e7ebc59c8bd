"""Imports every family module so that each registers its paged subclasses."""

from keras_vllm.layers import gemma  # noqa: F401
from keras_vllm.layers import gpt2  # noqa: F401
from keras_vllm.layers import llama  # noqa: F401
