"""Paged layers for Qwen 3.5 (`Qwen3_5Attention`, `Qwen3_5GatedDeltaNet`).

Qwen 3.5 is a hybrid: three of every four decoder layers mix tokens with
Gated DeltaNet linear attention (a per-sequence recurrent state), the
fourth with gated full attention.

- Full attention: the query projection gives `2 * head_dim` per head
  (`[query | gate]`); per-head RMSNorm of queries and keys; rotary
  embedding on the first `partial_rotary_factor` of each head (25% in the
  presets) at vLLM's positions; grouped-query attention over the paged KV
  cache with scale `1/sqrt(head_dim)`; the output is multiplied by
  `sigmoid(gate)` before the output projection. Text only: M-RoPE
  (`mrope_section`) needs image positions and is not served.
- Gated DeltaNet: `[Q | K | V]`, `z`, `b`, `a` projections; a depthwise
  causal conv1d over `[Q | K | V]` (its last `kernel - 1` inputs are the
  conv state), SiLU, L2-normalised q/k, the gated delta rule (the recurrent
  state), a gated RMSNorm `* silu(z)` and the output projection. The state
  part runs on tpu-inference's op (`PagedRecurrentState.
  paged_gated_delta_rule`); the projections and the norm are the parent's
  own sublayers.

KerasHub 0.32's cached `generate()` is not this model's forward pass: it
seeds its caches with the whole right-padded batch (the linear layers
ignore the padding mask, so padding enters the conv and delta-rule state)
and then feeds the last prompt token through the linear layers a second
time. Greedy decoding by the forward pass is the reference
(`golden_reference = "forward_pass"`).
"""

from keras import ops
from keras_hub.src.models.qwen3_5.qwen3_5_attention import Qwen3_5Attention
from keras_hub.src.models.qwen3_5.qwen3_5_backbone import Qwen3_5Backbone
from keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net import (
    Qwen3_5GatedDeltaNet,
)

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention
from keras_vllm.layers.common.recurrent_state import PagedRecurrentState
from keras_vllm.layers.common.recurrent_state import StateSpec
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.registry import register_text_decoder
from keras_vllm.layers.common.rotary_attention import rotate_partially


@register_paged(Qwen3_5Attention)
class PagedQwen3_5Attention(Qwen3_5Attention, PagedAttention):
    """`Qwen3_5Attention` (gated, partial RoPE) over vLLM's paged KV cache."""

    golden_reference = "forward_pass"

    def kv_cache_spec(self):
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
        )

    def prefix_cacheable(self):
        # Its KV blocks could be reused, but the linear layers' state in
        # the same model cannot.
        return False

    def _rotate(self, x, positions):
        return rotate_partially(
            self.rotary_embedding_layer, x, positions, self.rotary_dim
        )

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        position_ids=None,
        training=None,
    ):
        positions = self.serving_positions()
        head_dim = self.head_dim
        query_and_gate = self._query_dense(hidden_states)  # [T, 1, H, 2D]
        query = query_and_gate[..., :head_dim]
        gate = query_and_gate[..., head_dim:]
        query = self._rotate(self._query_norm(query), positions)
        key = self._rotate(
            self._key_norm(self._key_dense(hidden_states)), positions
        )
        value = self._value_dense(hidden_states)
        out = self.paged_attend(
            query, key, value, sm_scale=self._inv_norm_factor
        )
        # The gate multiplies each head's output (KerasHub flattens both to
        # `H * D`; elementwise, the layout is the same).
        out = out * ops.sigmoid(gate)
        out = self._output_dense(out)
        return (out, cache) if cache is not None else out


@register_paged(Qwen3_5GatedDeltaNet)
class PagedQwen3_5GatedDeltaNet(Qwen3_5GatedDeltaNet, PagedRecurrentState):
    """`Qwen3_5GatedDeltaNet` with its state in vLLM's per-request slots."""

    golden_reference = "forward_pass"

    def state_spec(self):
        conv_dim = 2 * self.key_dim + self.value_dim
        return StateSpec(
            shapes=(
                (self.conv_kernel_size - 1, conv_dim),
                (self.num_v_heads, self.head_k_dim, self.head_v_dim),
            ),
            # KerasHub keeps the conv window in the compute dtype and the
            # delta-rule state in float32 (`Qwen3_5CausalLM._build_cache`).
            dtypes=(self.compute_dtype, "float32"),
        )

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        x = hidden_states[:, 0]  # vLLM's T tokens, [T, hidden]
        tokens = ops.shape(x)[0]
        core = self.paged_gated_delta_rule(
            self.in_proj_qkv(x),
            self.in_proj_b(x),
            self.in_proj_a(x),
            conv_weight=self.conv1d_weight,
            A_log=self.A_log,
            dt_bias=self.dt_bias,
            num_key_heads=self.num_k_heads,
            num_value_heads=self.num_v_heads,
            key_head_dim=self.head_k_dim,
            value_head_dim=self.head_v_dim,
        )
        core = ops.cast(ops.reshape(core, (-1, self.head_v_dim)), x.dtype)
        z = ops.reshape(self.in_proj_z(x), (-1, self.head_v_dim))
        core = self.norm(core) * ops.silu(z)
        out = self.out_proj(ops.reshape(core, (tokens, 1, self.value_dim)))
        return (out, cache) if cache is not None else out



@register_text_decoder(Qwen3_5Backbone)
def qwen3_5_text_decoder(config):
    """Qwen 3.5 without its vision encoder: the same decoder layers, names
    and variables (`Qwen3_5Backbone` builds no interleave layer then). On a
    text prompt the full model scatters no vision rows into its embeddings
    and its functional graph passes no M-RoPE positions (the attention
    layers rotate by 1D positions either way), so it computes what the
    text-only model computes."""
    if config.get("vision_encoder") is None:
        return None
    return dict(config, vision_encoder=None)
