"""Paged attention for Gemma 4's text decoder (`Gemma4TextAttention`).

Mechanics: per-head RMSNorm of queries and keys (`query_norm`, `key_norm`)
before RoPE and a scale-free RMS norm of values (`value_norm`); attention
scale 1.0 (the norms replace `1/sqrt(head_dim)`); each layer's own
`RotaryEmbedding` at vLLM's positions, rotating only the first
`rotary_dim // 2` dims of each half of the head on global layers
("proportional" partial RoPE, the parent's `_apply_rope`); the sliding
window on local layers (`q - k < sliding_window_size`); an optional
attention logit soft cap.

Global layers may use another head size (`global_head_dim`) and fewer KV
heads with keys equal to values (`attention_k_eq_v`: the raw key
projection, value-normed, is the value), so each layer declares its own
`KVCacheSpec`. The last `num_kv_shared_layers` layers compute no keys or
values: they attend over the cache of the last earlier layer of the same
kind (the backbone's `_kv_source`, which is the rule vLLM's runner applies
to `layer_types`), declared with `KVCacheSpec(shares_cache=True)` and
attended with `update_kv_cache=False`.

The mixture-of-experts blocks of MoE presets (26B-A4B: a dense FFN and
experts in parallel, summed) are served routed (`RoutedGemma4MoEBlock`):
KerasHub's router gives each token dense dispatch weights with its top-k
experts' renormalised probabilities; the expert bank then computes only
those experts (GELU-gated, each scaled by its `per_expert_scale`).

A backbone with a vision encoder whose preprocessor takes images serves
them (`layers/gemma4_images.py`, E2B / E4B included); otherwise, or with
an audio encoder's inputs, it serves its text decoder (registered below):
text prompts only. Chat: `GEMMA4_CHAT_TEMPLATE` (below).
Embedding models (bidirectional attention) are refused.
"""

import keras
from keras import ops
from keras_hub.src.models.gemma4.gemma4_attention import Gemma4TextAttention
from keras_hub.src.models.gemma4.gemma4_backbone import Gemma4Backbone
from keras_hub.src.models.gemma4.gemma4_decoder_block import (
    Gemma4TextDecoderBlock,
)
from keras_hub.src.models.gemma4.gemma4_moe import Gemma4MoEBlock

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common import expert_groups
from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.context import current_context
from keras_vllm.layers.common.image_inputs import chat_content_jinja
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.registry import register_raw_kernel_readers
from keras_vllm.layers.common.registry import register_text_decoder
from keras_vllm.layers.common.routed_experts import RoutedExperts
from keras_vllm.layers.common.routed_experts import routed_moe_enabled


def _window(layer):
    """The layer's window in tokens, or None for global attention."""
    if layer.use_sliding_window_attention:
        return int(layer.sliding_window_size)
    return None


@register_paged(Gemma4TextAttention)
class PagedGemma4TextAttention(Gemma4TextAttention, PagedAttention):
    """`Gemma4TextAttention` over vLLM's paged KV cache."""

    def kv_cache_spec(self):
        # Called on the KerasHub layer before it is swapped: parent state
        # only.
        if self.use_bidirectional_attention:
            raise UnsupportedModelError(
                "Gemma 4 with bidirectional attention (an embedding model) "
                "is not a causal language model and cannot be served for "
                "generation."
            )
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.effective_num_kv_heads,
            head_dim=self.head_dim,
            sliding_window=_window(self),
            shares_cache=bool(self.is_kv_shared_layer),
        )

    def call(
        self,
        x,
        attention_mask=None,
        cache=None,
        cache_update_index=0,
        cache_update_mask=None,
        shared_kv=None,
        training=False,
        positions=None,
    ):
        positions = self.serving_positions()
        query = self.query_norm(self.query_dense(x))
        query = self._apply_rope(query, 0, positions=positions)
        if self.is_kv_shared_layer:
            # Keys and values of this step were written by the source
            # layer (it ran earlier in the same step); the kernel reads
            # them from that cache and writes nothing. Zeros of the
            # cache's shape stand in for the keys it does not take.
            zeros = query[:, :, : self.effective_num_kv_heads] * 0
            out = self.paged_attend(
                query, zeros, zeros, sm_scale=1.0,
                sliding_window=_window(self), soft_cap=self.logit_soft_cap,
                update_kv_cache=False,
            )
        else:
            raw_key = self.key_dense(x)
            key = self._apply_rope(
                self.key_norm(raw_key), 0, positions=positions
            )
            if self.attention_k_eq_v:
                value = self.value_norm(raw_key)
            else:
                value = self.value_norm(self.value_dense(x))
            # Image placeholders see their whole image on sliding-window
            # layers only (`gemma4_images`); global layers stay causal.
            out = self.paged_attend(
                query, key, value, sm_scale=1.0,
                sliding_window=_window(self), soft_cap=self.logit_soft_cap,
                image_spans=not self.is_global_attention,
            )
            shared_kv = ops.stack((key, value), axis=1)
        # The backbone hands this to the layers that share this one's keys
        # and values (their paged call reads the paged cache instead); XLA
        # drops it as unused.
        return self.output_dense(out), shared_kv


@register_paged(Gemma4MoEBlock)
class RoutedGemma4MoEBlock(Gemma4MoEBlock, RoutedExperts):
    """`Gemma4MoEBlock` (the expert bank) computing each token's top-k
    experts only."""

    def bind_parent(self, parent):
        """Reads the experts per token from the decoder block's router (the
        bank itself only sees the router's dense dispatch weights)."""
        router = getattr(parent, "moe_router", None)
        if router is not None:
            self.routed_top_k = int(router.num_experts_per_token)

    def expert_kernels(self):
        return (self.gate_proj, self.up_proj), self.down_proj

    def expert_hidden(self, gate, up):
        # GELU (tanh approximation) in float32, as the KerasHub bank.
        gate = keras.activations.gelu(
            ops.cast(gate, "float32"), approximate=True
        )
        return ops.cast(gate, up.dtype) * up

    def call(self, x, dispatch_weights):
        top_k = getattr(self, "routed_top_k", None)
        if not routed_moe_enabled() or top_k is None:
            return Gemma4MoEBlock.call(self, x, dispatch_weights)
        # The k non-zero dispatch weights are the router's top-k; each
        # expert's output scale folds into its weight.
        weights, experts = ops.top_k(dispatch_weights, k=top_k)
        scale = ops.take(
            ops.cast(self.per_expert_scale, weights.dtype), experts
        )
        context = current_context()
        num_valid = None if context is None else context.real_tokens()
        mesh = None if context is None else context.mesh
        return self.routed_output(
            x, weights * scale, experts, num_valid,
            grouped_kernel=expert_groups.tpu_kernel_fits(mesh),
        )


# Gemma 4's instruction-tuned presets chat in turns written
# `<|turn>ROLE\n...<turn|>\n` (roles `system`, `user`, `model`), the model's
# turn opened by `<|turn>model\n`. A message's content may be a string or a
# list of parts (OpenAI chat, which vLLM passes as parts): each image part
# is written as the image marker `<|image|>` where it stands, the place
# `Gemma4CausalLMPreprocessor` expands it to `<|image>`, the placeholders
# and `<image|>` (`gemma4_image_inputs`); text is trimmed, as a string
# content is.
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set state = namespace(text='') %}"
    "{% for m in messages %}"
    + chat_content_jinja("<|image|>")
    + "<|turn>{{ 'model' if m['role'] in ('assistant', 'model') else "
    "('system' if m['role'] in ('system', 'developer') else 'user') }}\n"
    "{{ state.text }}<turn|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)
register_chat_template(
    "Gemma4Tokenizer", GEMMA4_CHAT_TEMPLATE, tokens=("<|turn>", "<turn|>")
)


@register_text_decoder(Gemma4Backbone)
def gemma4_text_decoder(config):
    """Gemma 4 without its vision and audio encoders: the same decoder
    layers, names and variables (on a text prompt the full model's vision
    and audio masks are all False, so its decoder computes the same)."""
    if config.get("vision_encoder") is None and (
        config.get("audio_encoder") is None
    ):
        return None
    return dict(config, vision_encoder=None, audio_encoder=None)


# KerasHub 0.32's Gemma 4 decoder block computes its dense FFN (both
# shapes) as `ops.matmul(x, self.gating_ffw.kernel)` etc. ("HOTFIX" in its
# source), never calling those layers: quantized, their int8 kernels would
# multiply unscaled (measured: int8 logits 0.54 off float's, on a scale of
# 1.8, where Llama's are 0.006 off).
register_raw_kernel_readers(
    Gemma4TextDecoderBlock, ("gating_ffw", "gating_ffw_2", "ffw_linear")
)
