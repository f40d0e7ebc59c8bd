"""What Gemma-style attention layers share over vLLM's cache.

Gemma, Gemma 2 and Gemma 3 attention differ in how they position queries
and keys (Gemma's half-interleaved RoPE, Gemma 3's query/key norms and
per-layer rotary wavelengths), but share the rest: query scaling by
`head_dim` or by `hidden_dim / num_heads` (Gemma 2's
query_pre_attn_scalar), the attention logit soft cap, and a sliding window
on the layers that use one. Each family's subclass positions q and k, then
calls `gemma_attend`.
"""

import math

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.common.base import PagedAttention


def _window(layer):
    """The layer's window in tokens, or None for global attention."""
    if layer.use_sliding_window_attention:
        return int(layer.sliding_window_size)
    return None


class GemmaPagedAttention(PagedAttention):
    """Mixin: `PagedAttention` with Gemma's scale, soft cap and window.

    Subclasses (`class PagedX(X, GemmaPagedAttention)`) implement `call`:
    project and position q and k with the parent's layers, then return
    `self.gemma_attend(query, key, value)` projected out.
    """

    __slots__ = ()

    def kv_cache_spec(self):
        # Called on the KerasHub layer before it is swapped (to size vLLM's
        # cache), so it uses no other method of this mixin.
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            sliding_window=_window(self),
        )

    def gemma_attend(self, query, key, value):
        """Attends with the layer's query scaling, soft cap and window."""
        if self.query_head_dim_normalize:
            scale = 1.0 / math.sqrt(self.head_dim)
        else:
            scale = 1.0 / math.sqrt(self.hidden_dim // self.num_query_heads)
        return self.paged_attend(
            query,
            key,
            value,
            sm_scale=scale,
            sliding_window=_window(self),
            soft_cap=self.logit_soft_cap,
        )
