"""Paged attention for Qwen MoE (Qwen 1.5 MoE, `QwenMoeAttention`).

Mechanics: as Qwen 2 (q/k/v biases, RoPE at vLLM's positions, grouped-query
attention, softmax scale `1/sqrt(head_dim)`). Unlike `QwenAttention`, this
layer's dense path skips the fused op on CPU (it uses it only on GPU/TPU), so
KerasHub applies `use_sliding_window_attention` there (`q_pos - k_pos <
sliding_window_size`); this layer follows that flag.

The sparse mixture-of-experts block is served routed
(`RoutedQwenSparseMoeBlock`): softmax over the experts, top-k,
renormalised when `norm_top_k_prob`; each expert a SwiGLU with one fused
gate-and-up kernel; plus the shared expert, gated per token by
`sigmoid(shared_expert_gate_dense(x))`.
"""

from keras import ops
from keras_hub.src.models.qwen_moe.qwen_moe_attention import QwenMoeAttention
from keras_hub.src.models.qwen_moe.qwen_moe_decoder import QwenSparseMoeBlock

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import head_size
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention
from keras_vllm.layers.common.routed_experts import RoutedExperts
from keras_vllm.layers.common.routed_experts import softmax_top_k
from keras_vllm.layers.qwen import CHATML_TOKENS
from keras_vllm.layers.qwen import CHATML_TURNS


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


class QwenRoutedExperts(RoutedExperts):
    """Qwen MoE's router and experts, as KerasHub's `QwenSparseMoeBlock`
    computes them (Qwen 3 MoE's block computes the same): softmax, top-k,
    renormalised when `norm_top_k_prob`; each expert a SwiGLU over one
    fused `[gate, up]` kernel."""

    call = RoutedExperts.call

    def route(self, tokens):
        logits = self._sparse_feedforward_gate_dense(tokens)
        weights, experts = softmax_top_k(
            logits, self.top_k, renormalize=self.norm_top_k_prob
        )
        return logits, weights, experts

    def expert_kernels(self):
        bank = self.expert_bank
        return (
            (bank._expert_feedforward_gate_dense,),
            bank._expert_feedforward_output_dense,
        )

    def expert_hidden(self, gate_up):
        gate, up = ops.split(gate_up, 2, axis=-1)
        return up * self.expert_bank.activation(gate)


@register_paged(QwenSparseMoeBlock)
class RoutedQwenSparseMoeBlock(QwenSparseMoeBlock, QwenRoutedExperts):
    """`QwenSparseMoeBlock` computing each token's top-k experts only."""

    call = RoutedExperts.call

    def shared_expert_output(self, tokens):
        gate = ops.sigmoid(self.shared_expert_gate_dense(tokens))
        return self.shared_expert_dense(tokens) * gate
