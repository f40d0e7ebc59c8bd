"""Engine start time, output tokens/s and per-device weight bytes at each
tensor-parallel size, on this host (virtual JAX CPU devices without a TPU).

```
python -m keras_vllm.bench.tensor_parallel --family llama --sizes 1,2 --prompts 16 --max-tokens 64
```

Prints one row per TP size. The model is a tiny random KerasHub model of the
family (throughput does not depend on the weights' values), exported once.
Each engine is started in vLLM's default multiprocess mode with the product's
warm-up, so start times include compiling every bucket.
"""

from keras_vllm.bench import engine_rate


def main():
    args = engine_rate.size_arguments(__doc__.splitlines()[0], prompts=16)
    rows = engine_rate.measure_sizes(args, "tensor_parallel_size")
    engine_rate.print_table(
        args,
        ["TP", "engine start (s)", "output tok/s", "weight bytes per device"],
        [[str(size), f"{started:.1f}", f"{rate:.1f}",
          ", ".join(str(d) for d in devices)]
         for size, started, rate, devices in rows],
    )


if __name__ == "__main__":
    main()
