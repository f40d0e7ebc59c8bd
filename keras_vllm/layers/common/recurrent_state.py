"""Paged layers whose per-sequence memory is a recurrent state, not a KV cache.

Linear-attention layers (Gated DeltaNet) keep, per sequence, a fixed-size
state that every new token reads and rewrites: a short convolution window
and a delta-rule matrix per value head. vLLM manages such state as "mamba"
state (`MambaSpec`): one slot per running request, addressed each step by
`attention_metadata.mamba_state_indices`, and handed to the model as a
`(conv_state, recurrent_state)` tuple in place of a KV cache.

A layer kind with recurrent state declares what it needs with
`state_spec()` (next to attention layers' `kv_cache_spec()`); its paged
`call` runs the whole flat batch (prefills, chunked-prefill continuations
and decodes together) with `paged_gated_delta_rule`, which calls
tpu-inference's op (`run_jax_gdn_attention`) with the kernel
`gated_delta_rule.kernel_for` picks: tpu-inference's Pallas kernel on a TPU
for the head sizes it takes, the portable JAX one elsewhere, and while the
engine speculates the portable one that keeps a state per draft position
(in the `num_speculative_tokens + 1` slots the runner then gives each
request), so that rejected drafts leave the state as it was.

Nothing here names a model family.
"""

import dataclasses

from keras import ops

from keras_vllm.layers.common import gated_delta_rule
from keras_vllm.layers.common.context import require_context
from keras_vllm.layers.common.state_sharding import check_heads_split
from keras_vllm.layers.common.state_sharding import per_shard_order


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """What vLLM needs to size one recurrent layer's per-sequence state.

    Attributes:
        shapes: one shape per state array, without the slot axis (vLLM
            allocates `[num_slots, *shape]` for each).
        dtypes: one dtype name per state array.
    """

    shapes: tuple
    dtypes: tuple

    # Read by the cache bookkeeping shared with `KVCacheSpec`: a state is
    # never shared and never windowed.
    recurrent = True
    shares_cache = False
    sliding_window = None

    def bytes_per_sequence(self):
        """The state's size for one sequence, in bytes."""
        import numpy as np

        return sum(
            int(np.prod(shape)) * np.dtype(dtype).itemsize
            for shape, dtype in zip(self.shapes, self.dtypes)
        )


class PagedRecurrentState:
    """Mixin of paged subclasses of layers with a recurrent state.

    A subclass lists the KerasHub class first (`class PagedX(X,
    PagedRecurrentState)`) and implements `state_spec()` (also called as
    `PagedX.state_spec(layer)` on the unswapped KerasHub layer) and `call`.
    Like attention layers, it gets `kv_layer_index` (its place among the
    layers with per-sequence memory, vLLM's `layer.{i}`) when swapped in;
    its entry of the step's caches is its `(conv_state, recurrent_state)`.
    """

    __slots__ = ()
    _is_paged_layer = True
    _owns_kv_cache = True
    _has_recurrent_state = True
    golden_reference = "generate"

    def state_spec(self):
        raise NotImplementedError

    def prefix_cacheable(self):
        """False: a state holds the whole prefix, and vLLM cannot rebuild
        it from cached KV blocks (its "align" mode is not used)."""
        return False

    def paged_gated_delta_rule(
        self,
        mixed_qkv,
        b,
        a,
        *,
        conv_weight,
        A_log,
        dt_bias,
        num_key_heads,
        num_value_heads,
        key_head_dim,
        value_head_dim,
        conv_bias=None,
    ):
        """Causal conv1d + gated delta rule over vLLM's flat batch.

        Reads this layer's `(conv_state, recurrent_state)` at each request's
        slot, writes the updated state back into the step's caches. On a
        tensor-parallel mesh the heads are split over the devices, the
        `[Q | K | V]` channels reordered so that each device's slice is its
        own heads' (`state_sharding.per_shard_order`).

        Args:
            mixed_qkv: `[T, 2 * key_dim + value_dim]`, the `[Q | K | V]`
                projection before the convolution.
            b: `[T, num_value_heads]` write-gate logits (`beta = sigmoid(b)`).
            a: `[T, num_value_heads]` decay inputs
                (`g = -exp(A_log) * softplus(a + dt_bias)`).
            conv_weight: `[conv_dim, kernel_size]` depthwise kernel.
            A_log, dt_bias: `[num_value_heads]`.
            num_key_heads, num_value_heads, key_head_dim, value_head_dim:
                the layer's head layout (query/key heads are repeated to the
                value heads).
            conv_bias: optional `[conv_dim]`.

        Returns:
            `[T, num_value_heads * value_head_dim]`: the delta rule's output
            (before the layer's gated norm).
        """
        from tpu_inference.layers.common.gdn_attention import run_jax_gdn_attention

        from keras_vllm.layers.common.paged_attention import _resolve_mesh

        context = require_context(self)
        metadata = context.metadata(self.kv_layer_index)
        conv_state, recurrent_state = context.read_cache(self.kv_layer_index)
        kernel_size = int(conv_weight.shape[-1])
        mesh = _resolve_mesh(context.mesh)
        shards = _heads_shards(mesh)
        if shards > 1:
            # Each device's slice of the channels must be its own
            # `[Q_i | K_i | V_i]` (`state_sharding`).
            check_heads_split(num_key_heads, num_value_heads, shards)
            order = per_shard_order(
                num_key_heads, key_head_dim, num_value_heads,
                value_head_dim, shards,
            )
            mixed_qkv = ops.take(mixed_qkv, order, axis=-1)
            conv_weight = ops.take(conv_weight, order, axis=0)
            if conv_bias is not None:
                conv_bias = ops.take(conv_bias, order, axis=0)
        (new_conv, new_recurrent), out = run_jax_gdn_attention(
            mixed_qkv,
            b,
            a,
            conv_state,
            recurrent_state,
            ops.expand_dims(conv_weight, 1),
            conv_bias,
            A_log,
            dt_bias,
            metadata.mamba_state_indices,
            metadata.query_start_loc,
            metadata.request_distribution,
            metadata.seq_lens,
            n_kq=num_key_heads,
            n_v=num_value_heads,
            d_k=key_head_dim,
            d_v=value_head_dim,
            kernel_size=kernel_size,
            mesh=mesh,
            conv1d_gdn_kernel=gated_delta_rule.kernel_for(
                key_head_dim, value_head_dim, context.state_window
            ),
        )
        context.write_cache(self.kv_layer_index, (new_conv, new_recurrent))
        return out


def _heads_shards(mesh):
    """Devices along the mesh's attention-heads axis."""
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.utils import get_mesh_shape_product

    return int(get_mesh_shape_product(mesh, ShardingAxisName.ATTN_HEAD))
