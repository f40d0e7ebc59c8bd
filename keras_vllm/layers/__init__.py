"""Paged (vLLM) subclasses of KerasHub layers, one small module per family.

- `registry`: the leaf every family module registers with.
- `families`: the family table (imports every family module).
- `swap`: what generic code calls: find attention layers, check a backbone
  is servable, size its KV caches, swap the paged subclasses in.
- `base`, `rotary_attention`, `gemma_attention`, `alibi_attention`,
  `paged_attention`, `context`: what family modules build on (the
  mixins hold the math families share).

This package imports nothing by itself, so importing one module of it
does not import every family.
"""
