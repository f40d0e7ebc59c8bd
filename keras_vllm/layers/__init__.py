"""Paged (vLLM) subclasses of KerasHub layers, one small module per family.

- one module per family (`llama`, `gemma3`, ...): its paged subclasses.
- `families`: the family table (imports every family module).
- `swap`: what generic code calls: find attention layers, check a backbone
  is servable, size its KV caches, swap the paged subclasses in.
- `common/`: what family modules build on (the registry, the shared paged
  attention call, the mixins that hold the math families share).

This package imports nothing by itself, so importing one module of it
does not import every family.
"""
