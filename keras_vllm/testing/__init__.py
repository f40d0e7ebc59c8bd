"""Offline fixtures: tiny KerasHub CausalLMs for every supported family.

Nothing here downloads anything. Tokenizers are trained on a small built-in
corpus, backbones are tiny random versions of real preset configs, and
`fine_tune` trains them briefly so that greedy continuations depend on the
prompt (which makes "serving output equals `generate()`" checks meaningful).

```python
from keras_vllm import testing

causal_lm = testing.build_tiny_causal_lm("llama3")
losses = testing.fine_tune(causal_lm)
causal_lm.generate("the quick brown", max_length=24)
preset = testing.save_tiny_preset(causal_lm, "/tmp/tiny_llama3")
```

This module depends only on keras, keras-hub, numpy, `tokenizers` and
`sentencepiece`, not on the rest of keras-vllm.
"""

import os

# Keras reads these once, when it is first imported.
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_NNX_ENABLED", "true")

from keras_vllm.testing.data import corpus  # noqa: E402
from keras_vllm.testing.data import prompts  # noqa: E402
from keras_vllm.testing.assistants import build_tiny_assistant  # noqa: E402
from keras_vllm.testing.models import FAMILIES  # noqa: E402
from keras_vllm.testing.models import LLAMA3_1_ROPE_SCALING  # noqa: E402
from keras_vllm.testing.models import PHI3_SU_ROPE_SCALING  # noqa: E402
from keras_vllm.testing.models import backbone_class  # noqa: E402
from keras_vllm.testing.models import backbone_config  # noqa: E402
from keras_vllm.testing.models import build_tiny_causal_lm  # noqa: E402
from keras_vllm.testing.models import causal_lm_class  # noqa: E402
from keras_vllm.testing.models import save_tiny_preset  # noqa: E402
from keras_vllm.testing.inputs import with_position_ids  # noqa: E402
from keras_vllm.testing.tokenizers import build_tiny_tokenizer  # noqa: E402
from keras_vllm.testing.training import distinct_continuations  # noqa: E402
from keras_vllm.testing.training import fine_tune  # noqa: E402
from keras_vllm.testing.training import greedy_continuations  # noqa: E402
from keras_vllm.testing.training import greedy_reference  # noqa: E402
from keras_vllm.testing.training import tokenize_corpus  # noqa: E402

__all__ = [
    "FAMILIES",
    "LLAMA3_1_ROPE_SCALING",
    "PHI3_SU_ROPE_SCALING",
    "backbone_class",
    "build_tiny_assistant",
    "backbone_config",
    "build_tiny_causal_lm",
    "build_tiny_tokenizer",
    "causal_lm_class",
    "corpus",
    "distinct_continuations",
    "fine_tune",
    "greedy_continuations",
    "greedy_reference",
    "prompts",
    "save_tiny_preset",
    "with_position_ids",
    "tokenize_corpus",
]
