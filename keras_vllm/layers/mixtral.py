"""Paged attention for Mixtral (`CachedMixtralAttention`).

Mechanics: as Mistral (RoPE at vLLM's positions, grouped-query attention,
softmax scale `1/sqrt(head_dim)`, the decoder's sliding window
`q_pos - k_pos < sliding_window`). The sparse mixture-of-experts
feed-forward is not attention and runs as the backbone's own layer: it
routes each token independently, so vLLM's flat batch needs no change.
"""

from keras_hub.src.models.mixtral.mixtral_attention import (
    CachedMixtralAttention,
)

from keras_vllm.layers.common.base import KVCacheSpec
from keras_vllm.layers.mistral import MISTRAL_CHAT_TEMPLATE
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged
from keras_vllm.layers.common.rotary_attention import RotaryPagedAttention


@register_paged(CachedMixtralAttention)
class PagedMixtralAttention(CachedMixtralAttention, RotaryPagedAttention):
    """`CachedMixtralAttention` over vLLM's paged KV cache."""

    call = RotaryPagedAttention.call

    PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")

    def kv_cache_spec(self):
        window = self.sliding_window
        return KVCacheSpec(
            num_query_heads=self.num_query_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self._head_dim,
            sliding_window=None if window is None else int(window),
        )

# Mixtral's instruct preset chats as Mistral's.
register_chat_template("MixtralTokenizer", MISTRAL_CHAT_TEMPLATE)
