"""Paged attention for Gemma and Gemma 2 (`CachedGemmaAttention`).

Mechanics: Gemma's RoPE layout (rotate, then interleave halves; the
parent's `_apply_rope` does both), query scaling by `head_dim` or by
`hidden_dim / num_heads` (Gemma 2's query_pre_attn_scalar), attention logit
soft-cap, and a sliding window on the layers that use one. The final logit
soft-cap lives in the backbone's `ReversibleEmbedding` and so is applied by
the backbone's own head.
"""

from keras_hub.src.models.gemma.gemma_attention import CachedGemmaAttention

from keras_vllm.layers.common.gemma_attention import GemmaPagedAttention
from keras_vllm.layers.common.registry import register_chat_template
from keras_vllm.layers.common.registry import register_paged


@register_paged(CachedGemmaAttention)
class PagedGemmaAttention(CachedGemmaAttention, GemmaPagedAttention):
    """`CachedGemmaAttention` over vLLM's paged KV cache."""

    def call(
        self,
        x,
        attention_mask=None,
        cache=None,
        cache_update_index=0,
        training=False,
    ):
        positions = self.serving_positions()
        query = self._apply_rope(self.query_dense(x), 0, positions=positions)
        key = self._apply_rope(self.key_dense(x), 0, positions=positions)
        out = self.gemma_attend(query, key, self.value_dense(x))
        out = self.output_dense(out)
        return (out, cache) if cache is not None else out


# The chat format of Gemma's instruction-tuned presets (Gemma 1, 1.1, 2,
# CodeGemma): `user` and `model` turns between `<start_of_turn>` and
# `<end_of_turn>`; Gemma has no system role, so a system message opens the
# first user turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set state = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}"
    "{% set state.system = (m['content'] | trim) ~ '\\n\\n' %}"
    "{% else %}"
    "<start_of_turn>{{ 'model' if m['role'] in ('assistant', 'model') "
    "else 'user' }}\n{{ state.system }}{{ m['content'] | trim }}"
    "<end_of_turn>\n{% set state.system = '' %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
register_chat_template(
    "GemmaTokenizer",
    GEMMA_CHAT_TEMPLATE,
    tokens=("<start_of_turn>", "<end_of_turn>"),
)
