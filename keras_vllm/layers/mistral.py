"""Paged attention for Mistral (`CachedMistralAttention`).

Mechanics: RoPE (the parent's `RotaryEmbedding`, with its scaling factor)
applied at vLLM's positions; grouped-query attention with unexpanded K/V;
an explicit `head_dim` (which may differ from `hidden_dim / num_heads`);
softmax scale `1/sqrt(head_dim)`; and the sliding window that KerasHub
applies in the decoder's mask (`q_pos - k_pos < sliding_window`, the
kernel's convention), or none when `sliding_window` is None.
"""

from keras_hub.src.models.mistral.mistral_attention import (
    CachedMistralAttention,
)

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention


@register_paged(CachedMistralAttention)
class PagedMistralAttention(CachedMistralAttention, RotaryPagedAttention):
    """`CachedMistralAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    def kv_cache_spec(self):
        window = self._sliding_window
        return KVCacheSpec(
            num_query_heads=self._num_query_heads,
            num_kv_heads=self._num_key_value_heads,
            head_dim=self._head_dim,
            sliding_window=None if window is None else int(window),
        )


# Mistral instruct: `[INST] user [/INST]answer</s>` after one start token;
# a system message opens the first instruction.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set state = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}"
    "{% set state.system = (m['content'] | trim) ~ '\\n\\n' %}"
    "{% elif m['role'] == 'user' %}"
    "[INST] {{ state.system }}{{ m['content'] | trim }} [/INST]"
    "{% set state.system = '' %}"
    "{% else %}{{ m['content'] | trim }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
register_chat_template("MistralTokenizer", MISTRAL_CHAT_TEMPLATE)
