"""`KerasVllmEngine`, in the caller's process.

- `engine`: `KerasVllmEngine` (`from_export`, `generate`, `chat`, ...).
- `adapters`: many LoRA adapters over one base.
- `updates`: new weights for a running engine.
- `sampling_defaults`: what `generate` and `chat` sample with by default.
- `greedy`: greedy continuations as token ids (the demo's comparison).
"""
