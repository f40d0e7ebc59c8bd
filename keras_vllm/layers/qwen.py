"""Paged attention for Qwen 2 / 2.5 (`QwenAttention`).

Mechanics: q/k/v projections with biases; RoPE (the parent's
`RotaryEmbedding`) applied at vLLM's positions; grouped-query attention
with unexpanded K/V; softmax scale `1/sqrt(head_dim)`. No sliding window:
KerasHub applies `use_sliding_window_attention` only on its non-fused path,
which never runs on JAX, so the Keras model (the reference) attends over
the whole context and so does this layer.
"""

from keras_hub.src.models.qwen.qwen_attention import QwenAttention

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import head_size
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention


@register_paged(QwenAttention)
class PagedQwenAttention(QwenAttention, RotaryPagedAttention):
    """`QwenAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_size(self._query_dense),
        )


# ChatML, as Qwen's instruct presets chat: `<|im_start|>role\n...<|im_end|>`.
CHATML_TURNS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
# Qwen 2.5 instruct answers as itself under its default system prompt.
register_chat_template(
    "QwenTokenizer",
    "{% if not messages or messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\n{% endif %}" + CHATML_TURNS,
    tokens=CHATML_TOKENS,
)
