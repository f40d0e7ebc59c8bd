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
        shares_cache: the layer computes no keys or values: it attends over
            the cache of the last earlier layer of the same kind (window or
            none) that has its own, and writes nothing (KV sharing; vLLM
            allocates it no cache). Shared layers come last in the model.
    """

    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    shares_cache: bool = False


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

    `self.kv_layer_index` (the layer's place among the attention layers,
    vLLM's `layer.{i}`) is assigned when the layer is swapped in, not by
    call order; the serving context maps it to a KV cache each step.
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

    def prefix_cacheable(self):
        """Whether the keys and values this layer writes for a token depend
        only on the tokens up to it, as vLLM's prefix caching assumes when it
        reuses another request's cached blocks.

        False for layers whose math also depends on how long the request's
        prompt is (Phi-3's "su" RoPE): the engine then serves with prefix
        caching off. Called like
        `kv_cache_spec`, on the KerasHub layer before it is swapped.
        """
        return True

    def needs_prompt_lengths(self):
        """Whether this layer reads each token's prompt length
        (`ServingContext.prompt_lengths`): the runner then passes it
        (`keras_vllm.serve.worker.prompt_lengths`). Called like
        `prefix_cacheable`."""
        return False

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
        update_kv_cache=True,
        image_spans=True,
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
                (same cache, pure JAX); no window, soft cap, sinks or
                shared cache with it.
            sinks: one logit per query head for an attention sink: one
                more softmax column with that logit and a zero value, so
                each head may attend to "nothing". tpu-inference takes
                sinks in its head_dim 64 kernel only (`paged_attention`).
            update_kv_cache: False for a layer that shares another's cache
                (`KVCacheSpec.shares_cache`): keys and values are read from
                that cache, `key` and `value` are ignored, nothing is
                written.
            image_spans: False for a layer whose image placeholders attend
                causally even on a step where the model's placeholders see
                their whole image (`ServingContext.attend_until`; Gemma 4's
                global layers).

        Returns:
            `[T, 1, num_query_heads, head_dim]` in the query's dtype.
        """
        context = require_context(self)
        layer = self.kv_layer_index
        args = (
            context.read_cache(layer),
            query[:, 0],
            key[:, 0],
            value[:, 0],
            context.metadata(layer),
        )
        if alibi_slopes is not None:
            from keras_vllm.layers.common.alibi_attention import paged_alibi_attention

            if any(
                a is not None for a in (sliding_window, soft_cap, sinks)
            ) or not update_kv_cache:
                raise ValueError(
                    "ALiBi paged attention takes no sliding window, soft cap, "
                    "sinks or shared cache."
                )
            new_cache, out = paged_alibi_attention(
                *args,
                sm_scale=float(sm_scale),
                alibi_slopes=[float(s) for s in alibi_slopes],
                mesh=context.mesh,
            )
        elif context.attend_until is not None and image_spans:
            # A step with image placeholders: some tokens see past
            # themselves, which tpu-inference's kernels cannot express.
            from keras_vllm.layers.common.span_attention import (
                paged_span_attention,
            )

            if sinks is not None or not update_kv_cache:
                raise ValueError(
                    "Image spans take no attention sinks or shared cache."
                )
            new_cache, out = paged_span_attention(
                *args,
                sm_scale=float(sm_scale),
                attend_until=context.attend_until,
                sliding_window=sliding_window,
                soft_cap=soft_cap,
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
                update_kv_cache=update_kv_cache,
                mesh=context.mesh,
            )
        if update_kv_cache:
            context.write_cache(layer, new_cache)
        else:
            context.mark_read(layer, passed_on=new_cache)
        return ops.cast(out[:, None], query.dtype)


class PagedPositionLayer:
    """Mixin of paged subclasses that read vLLM's positions but own no cache."""

    __slots__ = ()
    _is_paged_layer = True
    _owns_kv_cache = False

    def serving_positions(self):
        """vLLM's token positions as a `[T]` int32 tensor."""
        return require_context(self).positions


def _kind(spec):
    if getattr(spec, "recurrent", False):
        return "state"
    return "full" if spec.sliding_window is None else "sliding"


def cache_sources(specs):
    """Which layer's KV cache each attention layer attends over.

    A layer with `shares_cache` reads the cache of the last earlier layer
    of the same kind (sliding window or full attention) that has its own:
    the rule vLLM's runner applies to a config's `layer_types` and
    `num_kv_shared_layers`, so shared layers must come last.

    Args:
        specs: one `KVCacheSpec` per attention layer, in backbone order.

    Returns:
        A list: for each layer, the index of the layer whose cache it uses
        (itself when it has its own).

    Raises:
        UnsupportedModelError: shared layers that are not the last ones, or
            whose source has another shape.
    """
    from keras_vllm.errors import UnsupportedModelError

    shared = [i for i, spec in enumerate(specs) if spec.shares_cache]
    first = len(specs) - len(shared)
    if shared and shared != list(range(first, len(specs))):
        raise UnsupportedModelError(
            f"Attention layers {shared} share another layer's KV cache but "
            "are not the last layers of the model; vLLM shares caches only "
            "from the last layers (num_kv_shared_layers)."
        )
    sources = list(range(len(specs)))
    for i in shared:
        candidates = [
            j for j in range(first) if _kind(specs[j]) == _kind(specs[i])
        ]
        if not candidates:
            raise UnsupportedModelError(
                f"Attention layer {i} shares a KV cache, but no earlier "
                f"{_kind(specs[i])}-attention layer has one."
            )
        source = candidates[-1]
        if specs[source] != dataclasses.replace(specs[i], shares_cache=False):
            raise UnsupportedModelError(
                f"Attention layer {i} shares the KV cache of layer {source}, "
                f"which has another shape ({specs[source]} vs {specs[i]})."
            )
        sources[i] = source
    return sources


def cache_of_layer(specs):
    """For each attention layer, the index of its KV cache in the list vLLM
    allocates when it is told nothing else: one cache per layer that has
    its own, in order; a sharing layer gets its source's."""
    sources = cache_sources(specs)
    own = {}
    for i, source in enumerate(sources):
        if source == i:
            own[i] = len(own)
    return [own[source] for source in sources]
