"""The family table: every module of `keras_vllm/layers/` that serves a
KerasHub family. Importing this imports each, and each registers its paged
subclasses (`registry.register_paged`). Adding a family is adding its
module here and its test."""

from keras_vllm.layers import bloom  # noqa: F401
from keras_vllm.layers import falcon  # noqa: F401
from keras_vllm.layers import gemma  # noqa: F401
from keras_vllm.layers import gemma3  # noqa: F401
from keras_vllm.layers import gemma3n  # noqa: F401
from keras_vllm.layers import gemma4  # noqa: F401
from keras_vllm.layers import gemma4_images  # noqa: F401
from keras_vllm.layers import gpt2  # noqa: F401
from keras_vllm.layers import gpt_oss  # noqa: F401
from keras_vllm.layers import gpt_neo_x  # noqa: F401
from keras_vllm.layers import llama  # noqa: F401
from keras_vllm.layers import mistral  # noqa: F401
from keras_vllm.layers import mixtral  # noqa: F401
from keras_vllm.layers import phi3  # noqa: F401
from keras_vllm.layers import qwen  # noqa: F401
from keras_vllm.layers import qwen3  # noqa: F401
from keras_vllm.layers import qwen3_moe  # noqa: F401
from keras_vllm.layers import qwen3_5  # noqa: F401
from keras_vllm.layers import qwen3_5_moe  # noqa: F401
from keras_vllm.layers import qwen_moe  # noqa: F401
from keras_vllm.layers import smollm3  # noqa: F401
