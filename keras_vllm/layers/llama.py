"""Paged attention for Llama and Llama 3 (`LlamaAttention`).

Mechanics: RoPE (with Llama 3.1 frequency scaling, handled by the parent's
`LlamaRotaryEmbedding`) applied at vLLM's positions; grouped-query
attention with unexpanded K/V; softmax scale `1/sqrt(head_dim)`.
"""

from keras_hub.src.models.llama.llama_attention import LlamaAttention

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import head_size
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention


@register_paged(LlamaAttention)
class PagedLlamaAttention(LlamaAttention, RotaryPagedAttention):
    """`LlamaAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_size(self._query_dense),
        )


# Llama 3 / 3.1 / 3.2 instruct: each message under a role header, ended by
# `<|eot_id|>` (the tokenizer's second end token, a stop token).
register_chat_template(
    "Llama3Tokenizer",
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
)
# Llama 2 chat: each exchange is `<s>[INST] user [/INST] answer </s>`, the
# system prompt inside the first instruction between `<<SYS>>` markers.
register_chat_template(
    "LlamaTokenizer",
    "{% set state = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}"
    "{% set state.system = '<<SYS>>\\n' ~ (m['content'] | trim) "
    "~ '\\n<</SYS>>\\n\\n' %}"
    "{% elif m['role'] == 'user' %}"
    "{{ bos_token }}[INST] {{ state.system }}{{ m['content'] | trim }} "
    "[/INST]{% set state.system = '' %}"
    "{% else %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}"
    "{% endfor %}",
)
