"""Base classes of paged layers: what every family's subclass builds on."""

import dataclasses

from keras import ops

from keras_vllm.layers.common.context import require_context


@dataclasses.dataclass(frozen=True)
class KVCacheSpec:
    """What vLLM needs to size one attention layer's KV cache.

    Attributes:
        num_query_heads: query heads of the layer.
        num_kv_heads: key/value heads (equal to query heads without GQA).
        head_dim: size of each head.
        sliding_window: the window in tokens, or None for global attention.
    """

    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None


def head_size(projection):
    """The head size an `EinsumDense` into heads projects to.

    Read from its declared output shape, not its kernel: a quantized
    kernel may be packed (int4) or stored flattened (GPTQ/AWQ).
    """
    return int(projection.partial_output_shape[-1])


class PagedAttention:
    """Mixin of every paged attention subclass.

    A subclass lists the KerasHub class first
    (`class PagedX(X, PagedAttention)`: with the mixin first, CPython
    refuses to re-class an existing instance) and implements:

    - `kv_cache_spec(self) -> KVCacheSpec` (also called as
      `PagedX.kv_cache_spec(layer)` on the KerasHub layer before it is
      swapped, to size vLLM's cache: it may read only the parent's state);
    - `call(...)` with the parent's signature: project with the parent's
      own sublayers, apply positions at `self.serving_positions()`, and
      attend with `self.paged_attend(...)`.

    `self.kv_cache_index` (the layer's KV cache in vLLM's list) is assigned
    when the layer is swapped in, not by call order.
    """

    # No slots of its own, so that re-classing a KerasHub layer instance as
    # `class PagedX(X, PagedAttention)` keeps the same object layout.
    __slots__ = ()
    _is_paged_layer = True
    _owns_kv_cache = True
    # What predicts this layer's served output in Keras: KerasHub's cached
    # `generate()`, or "forward_pass" where a family's cached decoding is
    # known to be wrong (export records golden outputs with it).
    golden_reference = "generate"

    def kv_cache_spec(self):
        raise NotImplementedError

    def serving_positions(self):
        """vLLM's token positions as a `[T, 1]` int32 tensor.

        The model class feeds vLLM's flat batch of T tokens as T sequences
        of length one (so no `T x T` mask is ever built); this is the shape
        KerasHub's rotary layers take as `positions=` for that layout.
        """
        return ops.reshape(require_context(self).positions, (-1, 1))

    def paged_attend(
        self,
        query,
        key,
        value,
        *,
        sm_scale,
        sliding_window=None,
        soft_cap=None,
        alibi_slopes=None,
        sinks=None,
    ):
        """Attends over vLLM's paged KV cache for this layer.

        Args:
            query: `[T, 1, num_query_heads, head_dim]`.
            key: `[T, 1, num_kv_heads, head_dim]` (positions already applied).
            value: `[T, 1, num_kv_heads, head_dim]`.
            sm_scale: softmax scale applied to `q @ k`.
            sliding_window: window in tokens (`q_pos - k_pos < window`).
            soft_cap: attention logit soft cap (`cap * tanh(x / cap)`).
            alibi_slopes: one float per query head for an ALiBi bias
                `slope * (k_pos - q_pos)` in logit units (after `sm_scale`).
                tpu-inference's kernel has no additive bias, so these layers
                attend through `alibi_attention.paged_alibi_attention`
                (same cache, pure JAX); no window, soft cap or sinks with it.
            sinks: one logit per query head for an attention sink: one
                more softmax column with that logit and a zero value, so
                each head may attend to "nothing". tpu-inference takes
                sinks in its head_dim 64 kernel only (`paged_attention`).

        Returns:
            `[T, 1, num_query_heads, head_dim]` in the query's dtype.
        """
        context = require_context(self)
        index = self.kv_cache_index
        args = (
            context.read_cache(index),
            query[:, 0],
            key[:, 0],
            value[:, 0],
            context.attention_metadata,
        )
        if alibi_slopes is not None:
            from keras_vllm.layers.common.alibi_attention import paged_alibi_attention

            if any(a is not None for a in (sliding_window, soft_cap, sinks)):
                raise ValueError(
                    "ALiBi paged attention takes no sliding window, soft cap "
                    "or sinks."
                )
            new_cache, out = paged_alibi_attention(
                *args,
                sm_scale=float(sm_scale),
                alibi_slopes=[float(s) for s in alibi_slopes],
                mesh=context.mesh,
            )
        else:
            from keras_vllm.layers.common.paged_attention import paged_attention

            new_cache, out = paged_attention(
                *args,
                sm_scale=float(sm_scale),
                sliding_window=sliding_window,
                soft_cap=soft_cap,
                sinks=None if sinks is None else ops.convert_to_tensor(sinks),
                mesh=context.mesh,
            )
        context.write_cache(index, new_cache)
        return ops.cast(out[:, None], query.dtype)


class PagedPositionLayer:
    """Mixin of paged subclasses that read vLLM's positions but own no cache."""

    __slots__ = ()
    _is_paged_layer = True
    _owns_kv_cache = False

    def serving_positions(self):
        """vLLM's token positions as a `[T]` int32 tensor."""
        return require_context(self).positions
