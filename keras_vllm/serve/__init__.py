"""Everything vLLM runs or starts; the path says which process runs it.

- `engine/`: in the caller's process: `KerasVllmEngine` (from an artifact,
  adapters, live updates).
- `preflight`: what vLLM is told for an artifact and every refusal before
  it starts, shared by `from_export`, `keras-vllm serve` and
  `vllm serve DIR`.
- `process/`: how vLLM's engine process starts from a process running JAX.
- `frontend/`: in vLLM's front end (`LLM`, the API server): refusals,
  request checks (sampling, modalities), the reload and adapter routes,
  shutdown.
- `worker/`: in vLLM's worker: the tpu-inference model class and what its
  runner needs (sharding, LoRA slots, warm start, runner fixes).
- `tokenizer/`: the `keras_vllm` tokenizer mode (front end and structured
  outputs).
- `hf_config`: the `keras_vllm` model type for transformers.
- `plugin`: the two vLLM entry points, the one list of what each vLLM
  process installs.

Every replacement of an upstream function made here goes through
`keras_vllm.patching`. This package imports nothing by itself.
"""
