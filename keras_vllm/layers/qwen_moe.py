"""Paged attention for Qwen MoE (Qwen 1.5 MoE, `QwenMoeAttention`).

Mechanics: as Qwen 2 (q/k/v biases, RoPE at vLLM's positions, grouped-query
attention, softmax scale `1/sqrt(head_dim)`). Unlike `QwenAttention`, this
layer's dense path skips the fused op on CPU (it uses it only on GPU/TPU), so
KerasHub applies `use_sliding_window_attention` there (`q_pos - k_pos <
sliding_window_size`); this layer follows that flag. The mixture-of-experts
feed-forward (with its shared expert) runs as the backbone's own layer
(per-token routing).
"""

from keras_hub.src.models.qwen_moe.qwen_moe_attention import QwenMoeAttention

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import head_size
from keras_vllm.layers.qwen import CHATML_TOKENS
from keras_vllm.layers.qwen import CHATML_TURNS
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention


@register_paged(QwenMoeAttention)
class PagedQwenMoeAttention(QwenMoeAttention, RotaryPagedAttention):
    """`QwenMoeAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    PROJECTIONS = ("query_dense", "key_dense", "value_dense", "_output_dense")

    def kv_cache_spec(self):
        window = None
        if self.use_sliding_window_attention:
            window = int(self.sliding_window_size)
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_size(self.query_dense),
            sliding_window=window,
        )

# Its instruct presets chat in ChatML, without Qwen 2.5's default system.
register_chat_template("QwenMoeTokenizer", CHATML_TURNS, tokens=CHATML_TOKENS)
