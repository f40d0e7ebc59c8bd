"""The paged `call` shared by rotary grouped-query attention layers.

Several KerasHub attention layers do the same thing over vLLM's cache:
project q/k/v, rotate q and k with the layer's own `rotary_embedding_layer`
at vLLM's positions, attend with unexpanded K/V and scale
`_inv_norm_factor`, project out. KerasHub names the projections differently
per family, so each family's subclass lists its names in `PROJECTIONS`.
"""

from keras import ops

from keras_vllm.layers.common.base import PagedAttention


def rotate_partially(rope, x, positions, rotary_dim):
    """`rope` over the first `rotary_dim` features of each head of `x`, the
    rest passed through (partial rotary embedding).

    Args:
        rope: a KerasHub rotary layer taking `positions=`.
        x: `[T, 1, heads, head_dim]`.
        positions: `[T, 1]` (`PagedAttention.serving_positions()`).
        rotary_dim: how many leading features rotate.
    """
    if rotary_dim == x.shape[-1]:
        return rope(x, positions=positions)
    return ops.concatenate(
        (rope(x[..., :rotary_dim], positions=positions), x[..., rotary_dim:]),
        axis=-1,
    )


class RotaryPagedAttention(PagedAttention):
    """Mixin: `PagedAttention` with the rotary GQA `call`.

    Subclasses (`class PagedX(X, RotaryPagedAttention)`) bind
    `call = RotaryPagedAttention.call` (the KerasHub parent comes first in
    the MRO, so its own `call` would win), set `PROJECTIONS` (attribute
    names of the query, key, value and output projections) and implement
    `kv_cache_spec()`, whose `sliding_window` the attention applies (so the
    cache vLLM allocates and the attention cannot disagree).
    """

    __slots__ = ()
    PROJECTIONS = ("_query_dense", "_key_dense", "_value_dense", "_output_dense")

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        query_dense, key_dense, value_dense, output_dense = (
            getattr(self, name) for name in self.PROJECTIONS
        )
        positions = self.serving_positions()
        rope = self.rotary_embedding_layer
        query = rope(query_dense(hidden_states), positions=positions)
        key = rope(key_dense(hidden_states), positions=positions)
        out = self.paged_attend(
            query,
            key,
            value_dense(hidden_states),
            sm_scale=self._inv_norm_factor,
            sliding_window=self.kv_cache_spec().sliding_window,
            **self.attend_options(),
        )
        out = output_dense(out)
        return (out, cache) if cache is not None else out

    def attend_options(self):
        """More `paged_attend` arguments of a family (e.g. `sinks`)."""
        return {}
