"""Engine start time and output tokens/s at each data-parallel size, on
this host (virtual JAX CPU devices without a TPU).

```
python -m keras_vllm.bench.data_parallel --family llama --sizes 1,2 --prompts 32 --max-tokens 64
python -m keras_vllm.bench.data_parallel --model medium --sizes 1,2 --prompts 32 --max-tokens 64
```

Prints one row per DP size: `data_parallel_size=N` serves N replicas in
tpu-inference's one engine over a `(data, model)` mesh (docs/SCALING.md),
so the prompts (one batch, all submitted at once: concurrency = prompts)
are spread over the replicas. The model is a tiny random KerasHub model of
the family (or `--model medium`: the main benchmark's ~128M Qwen2),
exported once; engines start in vLLM's default multiprocess mode with the
product's warm-up. On a CPU host all replicas share its
cores, so the rows show the mechanism's overhead, not a TPU's scaling.
"""

from keras_vllm.bench import engine_rate


def main():
    args = engine_rate.size_arguments(__doc__.splitlines()[0], prompts=32)
    rows = engine_rate.measure_sizes(args, "data_parallel_size")
    engine_rate.print_table(
        args,
        ["DP", "engine start (s)", "output tok/s"],
        [[str(size), f"{started:.1f}", f"{rate:.1f}"]
         for size, started, rate, _ in rows],
    )


if __name__ == "__main__":
    main()
