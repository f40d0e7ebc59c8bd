"""vLLM tokenizer mode `keras_vllm`: the artifact's own KerasHub tokenizer.

`KerasVllmTokenizer` implements vLLM 0.32's `TokenizerLike` protocol
(`vllm/tokenizers/protocol.py`) over the native KerasHub tokenizer stored in
a keras-vllm artifact, so vLLM tokenizes prompts exactly as
`CausalLM.generate()` does (same ids, same start-token policy) and
detokenizes with the same vocabulary.

```python
from keras_vllm.serve import tokenizer as vllm_tokenizer

vllm_tokenizer.register()  # the `vllm.general_plugins` entry point does this
LLM(model="exports/my_model", tokenizer_mode="keras_vllm", ...)
```

How vLLM drives it (0.32):

- `TokenizerRegistry` resolves the mode to this class and calls
  `from_pretrained(path, truncation_side=...)`; the mode also selects the
  renderer, so `register()` maps it to vLLM's `HfRenderer` too.
- `HfRenderer` tokenizes with `__call__`, renders chat through
  `get_chat_template` + `apply_chat_template(conversation=..., ...)`, and
  reads `name_or_path`, `is_fast`, `max_chars_per_token`, `max_token_id`,
  `truncation_side`.
- The engine's output processor uses the *slow* incremental detokenizer
  (`is_fast` is False): `convert_ids_to_tokens` + `convert_tokens_to_string`
  over a sliding window, holding text back while it ends in U+FFFD.

Modules: `registration` (the mode and renderer entries), `vocabulary`
(ids <-> pieces, decoding), `special_tokens` (start, end, skipped ids),
`chat` (templates and their rendering), `bounded_jinja` (rendering bounded
in size and time), `chat_methods` (the class's chat-template methods),
`adapter` (the `TokenizerLike` class), `grammar` (structured outputs).

Nothing here runs a Keras layer's `__call__`: that initializes the JAX
runtime, and vLLM loads the tokenizer in its front-end process *before*
forking the engine process, which a live JAX runtime would abort.
"""

from keras_vllm.serve.tokenizer.adapter import KerasVllmTokenizer
from keras_vllm.serve.tokenizer.chat import MISSING_CHAT_TEMPLATE
from keras_vllm.serve.tokenizer.chat import NoChatTemplateError
from keras_vllm.serve.tokenizer.registration import CLASS_NAME
from keras_vllm.serve.tokenizer.registration import MODE
from keras_vllm.serve.tokenizer.registration import register

__all__ = [
    "CLASS_NAME",
    "KerasVllmTokenizer",
    "MISSING_CHAT_TEMPLATE",
    "MODE",
    "NoChatTemplateError",
    "register",
]
