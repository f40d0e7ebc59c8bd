"""Paged attention and routed experts for GPT-OSS (`GptOssAttention`,
`GptOssSparseMoeBlock`).

Attention mechanics: q/k/v/o projections with biases; YaRN RoPE (the
layer's own `RotaryEmbedding`, `rope_type="yarn"`, with its attention
factor) applied at vLLM's positions; grouped-query attention with
unexpanded K/V; softmax scale `1/sqrt(head_dim)`; one attention sink per
query head (the layer's `sinks` weight: one more softmax column with that
logit and a zero value, passed to the kernel as `sinks=`).

Windows: each layer follows its own `sliding_window` attribute, as the
Keras model does. KerasHub's `GptOssBackbone` gives layer `i` a window iff
`i % 2 == 1` (layer 0 global), the opposite of Hugging Face's GPT-OSS and
tpu-inference's (layer 0 windowed): keras-vllm serves what the Keras model
computes. KerasHub masks keys with `q_pos - k_pos <= sliding_window`; the
kernel masks `q_pos - k_pos < window`, so a windowed layer's cache and
attention use `sliding_window + 1`.

Sinks reach tpu-inference's head_dim 64 kernel only (the one GPT-OSS uses:
every preset has head_dim 64); a GPT-OSS model with another head size is
refused at export by name.

The sparse mixture-of-experts block is served routed
(`RoutedGptOssSparseMoeBlock`): the router is a Dense with bias, top-k on
its logits, then a softmax over the k; each expert projects to
interleaved gate/up columns (`[..., ::2]` / `[..., 1::2]`) with a bias,
clamps the gate above at `limit` and up to `[-limit, limit]`, computes
`(up + 1) * gate * sigmoid(alpha * gate)` and projects down with a bias.
"""

from keras import ops
from keras_hub.src.models.gpt_oss.gpt_oss_attention import GptOssAttention
from keras_hub.src.models.gpt_oss.gpt_oss_decoder import GptOssSparseMoeBlock

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention
from keras_vllm.layers.common.routed_experts import RoutedExperts

# The only head size whose kernel takes attention sinks on TPU.
SINK_HEAD_DIM = 64


@register_paged(GptOssAttention)
class PagedGptOssAttention(GptOssAttention, RotaryPagedAttention):
    """`GptOssAttention` over vLLM's paged KV cache."""

    PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")

    def kv_cache_spec(self):
        if self._head_dim != SINK_HEAD_DIM:
            raise UnsupportedModelError(
                f"GptOssAttention with head_dim {self._head_dim} cannot be "
                "served: its attention sinks run in tpu-inference's head_dim "
                f"{SINK_HEAD_DIM} kernel only (every GPT-OSS preset has "
                f"head_dim {SINK_HEAD_DIM}). Build the backbone with "
                f"head_dim={SINK_HEAD_DIM}."
            )
        window = self.sliding_window
        if window is not None and window > 0:
            # KerasHub keeps keys with q - k <= window; the kernel q - k < w.
            window = int(window) + 1
        else:
            window = None
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self._head_dim,
            sliding_window=window,
        )

    call = RotaryPagedAttention.call

    def attend_options(self):
        return {"sinks": self.sinks}


@register_paged(GptOssSparseMoeBlock)
class RoutedGptOssSparseMoeBlock(GptOssSparseMoeBlock, RoutedExperts):
    """`GptOssSparseMoeBlock` computing each token's top-k experts only."""

    call = RoutedExperts.call

    def route(self, tokens):
        router = self.router
        logits = router.router_dense(tokens)
        # Top-k on the logits, then a softmax over the k (KerasHub's
        # `GptOssTopKRouter`; `ops.top_k` decides ties as there).
        top, experts = ops.top_k(logits, k=router.top_k)
        weights = ops.softmax(top, axis=-1)
        # What the KerasHub block returns beside its output: the weights
        # scattered over all experts (zero for the others).
        mask = ops.cast(ops.one_hot(experts, router.num_experts), weights.dtype)
        scores = ops.sum(mask * ops.expand_dims(weights, axis=-1), axis=1)
        return scores, weights, experts

    def expert_kernels(self):
        bank = self.experts
        return (bank.gate_up_proj,), bank.down_proj

    def expert_biases(self):
        bank = self.experts
        return (bank.gate_up_proj_bias,), bank.down_proj_bias

    def expert_hidden(self, gate_up):
        bank = self.experts
        gate = gate_up[..., ::2]
        up = gate_up[..., 1::2]
        gate = ops.clip(gate, -1e9, bank.limit)
        up = ops.clip(up, -bank.limit, bank.limit)
        return (up + 1) * (gate * ops.sigmoid(gate * bank.alpha))
