"""What family modules build on.

- `registry`: the leaf every family module registers with.
- `base`, `context`: the paged-layer base and the per-step serving context.
- `paged_attention`: the one shared paged-attention call.
- `rotary_attention`, `gemma_attention`, `alibi_attention`: mixins holding
  the math families share.
- `lora_slots`: LoRA slots of served projections.
- `routed_experts`, `expert_groups`: mixture-of-experts blocks computing
  each token's top-k experts only.
"""
