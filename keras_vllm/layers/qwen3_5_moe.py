"""The routed sparse block of Qwen 3.5 MoE (`Qwen3_5MoeSparseMoeBlock`).

Qwen 3.5 MoE's decoder layers are Qwen 3.5's (Gated DeltaNet linear
attention three layers in four, gated full attention the fourth: their
paged subclasses are `keras_vllm.layers.qwen3_5`'s, since the MoE backbone
builds the same `Qwen3_5Attention` and `Qwen3_5GatedDeltaNet` classes),
with a sparse mixture-of-experts block in place of the MLP. KerasHub
computes every expert for every token and weights them by the router; this
subclass computes each token's top-k experts only
(`keras_vllm.layers.common.routed_experts`):

- router: `router_gate`, softmax over the experts, top-k, always
  renormalised (the block has no `norm_top_k_prob` flag);
- experts: SwiGLU over one fused `[gate | up]` kernel per expert
  (`[E, hidden, 2 * moe_intermediate]`), SiLU in float32 as KerasHub
  computes it;
- plus a shared SwiGLU expert (`shared_expert`, separate gate and up
  kernels) scaled per token by `sigmoid(shared_expert_gate(x))`.

A backbone with a vision encoder is exported whole and serves its text
decoder, as Qwen 3.5's (`qwen3_5_moe_text_decoder`).
"""

from keras import ops
from keras_hub.src.models.qwen3_5_moe.qwen3_5_moe_backbone import (
    Qwen3_5MoeBackbone,
)
from keras_hub.src.models.qwen3_5_moe.qwen3_5_moe_decoder import (
    Qwen3_5MoeSparseMoeBlock,
)

from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.registry import register_text_decoder
from keras_vllm.layers.common.routed_experts import RoutedExperts
from keras_vllm.layers.common.routed_experts import softmax_top_k


@register_paged(Qwen3_5MoeSparseMoeBlock)
class RoutedQwen3_5MoeSparseMoeBlock(Qwen3_5MoeSparseMoeBlock, RoutedExperts):
    """`Qwen3_5MoeSparseMoeBlock` computing each token's top-k experts only,
    plus its sigmoid-gated shared expert."""

    call = RoutedExperts.call

    def route(self, tokens):
        logits = self._router_gate(tokens)
        weights, experts = softmax_top_k(logits, self.top_k, renormalize=True)
        return logits, weights, experts

    def expert_kernels(self):
        bank = self.expert_bank
        return (
            (bank._expert_feedforward_gate_dense,),
            bank._expert_feedforward_output_dense,
        )

    def expert_hidden(self, gate_up):
        gate, up = ops.split(gate_up, 2, axis=-1)
        # KerasHub's experts take the SiLU in float32 (a no-op cast in a
        # float32 model, a precision choice in a bfloat16 one).
        gate = ops.cast(ops.silu(ops.cast(gate, "float32")), up.dtype)
        return up * gate

    def shared_expert_output(self, tokens):
        gate = ops.sigmoid(self._shared_expert_gate(tokens))
        return gate * self.shared_expert(tokens)


@register_text_decoder(Qwen3_5MoeBackbone)
def qwen3_5_moe_text_decoder(config):
    """Qwen 3.5 MoE without its vision encoder: the same decoder layers,
    names and variables; on a text prompt the full model computes the same
    (no vision rows scattered, no M-RoPE positions passed)."""
    if config.get("vision_encoder") is None:
        return None
    return dict(config, vision_encoder=None)
