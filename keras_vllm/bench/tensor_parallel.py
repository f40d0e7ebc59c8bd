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

import argparse

from keras_vllm.bench import engine_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama")
    parser.add_argument("--sizes", default="1,2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from keras_vllm import testing

    path = engine_rate.export(testing.build_tiny_causal_lm(args.family))
    prompts = engine_rate.corpus_prompts(args.prompts)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        started, rate, devices = engine_rate.measure(
            path, prompts, args.max_tokens, tensor_parallel_size=size
        )
        rows.append((size, started, rate, devices))
    engine_rate.print_table(
        args,
        ["TP", "engine start (s)", "output tok/s", "weight bytes per device"],
        [[str(size), f"{started:.1f}", f"{rate:.1f}",
          ", ".join(str(d) for d in devices)]
         for size, started, rate, devices in rows],
    )


if __name__ == "__main__":
    main()
