"""keras-vllm's parts of vLLM's worker (tpu-inference's runner).

- `model`: the tpu-inference model class that serves an artifact.
- `sharding`, `capacity`: where variables live on a tensor-parallel mesh,
  and what each device needs.
- `adapter_slots`, `lora_manager`, `lora_runner`: LoRA adapters.
- `extension`, `weight_update`: worker RPCs (live weight updates).
- `warm_start`, `compile_cache`: warm restarts from vLLM's compile cache.
- `grammar_rows`, `resumed_tokens`: fixes to tpu-inference 0.32's runner.
- `model_inspection`: `repr(llm)` of an engine serving an artifact.
"""
