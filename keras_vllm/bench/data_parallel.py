"""Engine start time and output tokens/s at each data-parallel size, on
this host (virtual JAX CPU devices without a TPU).

```
python -m keras_vllm.bench.data_parallel --family llama --sizes 1,2 --prompts 32 --max-tokens 64
```

Prints one row per DP size: `data_parallel_size=N` serves N replicas in
tpu-inference's one engine over a `(data, model)` mesh (docs/SCALING.md),
so the prompts (one batch, all submitted at once: concurrency = prompts)
are spread over the replicas. The model is a tiny random KerasHub model of
the family, exported once; engines start in vLLM's default multiprocess
mode with the product's warm-up. On a CPU host all replicas share its
cores, so the rows show the mechanism's overhead, not a TPU's scaling.
"""

import argparse

from keras_vllm.bench import engine_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama")
    parser.add_argument("--sizes", default="1,2")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from keras_vllm import testing

    path = engine_rate.export(testing.build_tiny_causal_lm(args.family))
    prompts = engine_rate.corpus_prompts(args.prompts)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        started, rate, _ = engine_rate.measure(
            path, prompts, args.max_tokens, data_parallel_size=size
        )
        rows.append((size, started, rate))
    engine_rate.print_table(
        args,
        ["DP", "engine start (s)", "output tok/s"],
        [[str(size), f"{started:.1f}", f"{rate:.1f}"]
         for size, started, rate in rows],
    )


if __name__ == "__main__":
    main()
