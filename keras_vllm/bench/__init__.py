"""The A/B/C-seed/C serving benchmark, on one set of weights.

    keras-vllm bench [--quick] [--model tiny|medium|...] [--out bench/results.json]
    python -m keras_vllm.bench [...]                  # the same `run.main`

One run builds a KerasHub model offline (a Qwen2, `--model tiny` or
`medium`, or a bfloat16 model of the seed's sizes: `gpt2_large`,
`llama3_1b`, `gemma3_1b`; see `models`), writes it out in every format the
systems read, and measures output tokens/s for each (prompt length,
concurrency) cell on:

- **A**      KerasHub `CausalLM.generate()` with static batches
             (batch = concurrency);
- **B**      vLLM's own model class for the family (tpu-inference's
             `Qwen2ForCausalLM` for the Qwen2 ones) under plain
             `vllm.LLM`, on `causal_lm.export_to_transformers(...)` output
             (fixed: `architectures` added, the duplicated tied
             `lm_head.weight` dropped);
- **C-seed** keras-hub's own `keras_hub.vllm.KerasHubLLM` on the model
             saved as a local preset;
- **C**      `keras_vllm.KerasVllmEngine.from_export` on our artifact.

Every system runs in its own subprocess (`python -m keras_vllm.bench
--worker SYSTEM`, see `workers`), one after the other, so no two engines
share a JAX runtime or memory; the parent process only
prepares the work, collects each worker's JSON and prints the tables. The
model preparation (build, exports, a LoRA fine-tune) runs in a subprocess
too. Prompts are random token ids (every prompt distinct, so prefix caching
never hits; "words" = tokens), given as ids to every system; decoding is
greedy with a fixed number of new tokens and stop tokens ignored. Each cell
first runs one untimed warm-up batch of other prompts.

Also recorded: export time and bytes (ours, `save_to_preset`,
`export_to_transformers`), time from process start to the first generated
token per engine, artifact bytes after a LoRA fine-tune (delta vs full), the
time per decode step, and how many outputs match A's token for token.

The engines share one setting (`measure.ENGINE_ARGS`): in-process EngineCore
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the only mode in which keras-hub
0.32's `KerasHubLLM` starts, see docs/benchmarks.md) and
`async_scheduling=False`; `--engine-mode default` runs B and C with
vLLM's defaults instead (C-seed stays in-process).

The modules, by responsibility: `cells` (cells and prompts), `models`
(the tiny and medium models), `measure` (timing A and the engines),
`prepare` (the model in every format), `workers` (the subprocesses),
`report` (the result document, schema `keras-vllm-bench/1`, and its
tables) and `run` (the command line). What does not start a worker is
tested without any vLLM engine in tests/test_bench.py.

The other benchmarks here run as modules too (`python -m
keras_vllm.bench.NAME`): `adapters`, `bf16_agreement`, `data_parallel`,
`export_cost`, `hybrid`, `kernel`, `moe`, `quantized`, `tensor_parallel` and
`warm_start` (`engine_rate` holds what the small ones share). vLLM and
tpu-inference are imported only where an engine starts, so
this package imports on an export-only install; nothing else in keras_vllm
imports it but the CLI, lazily.
"""

