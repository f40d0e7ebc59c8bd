"""Stored weight bytes, engine start and output tokens/s of one model in
float32, bfloat16 and Keras int8, on this host.

```
python -m keras_vllm.bench.quantized --family llama --prompts 16 --max-tokens 64
```

Prints one row per dtype. The model is a tiny random KerasHub model of the
family (throughput does not depend on the weights' values); the bfloat16 one
is built in bfloat16 and the int8 one is the float32 one quantized by
`backbone.quantize("int8")`. On CPU, XLA runs Keras' int8 matmuls as integer
dot products; on TPU they run on the MXU's int8 path.
"""

import argparse
import json
import os

from keras_vllm.bench import engine_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from keras_vllm import testing

    models = {
        "float32": testing.build_tiny_causal_lm(args.family),
        "bfloat16": testing.build_tiny_causal_lm(args.family, dtype="bfloat16"),
        "int8": testing.build_tiny_causal_lm(args.family),
    }
    models["int8"].backbone.quantize("int8")
    prompts = engine_rate.corpus_prompts(args.prompts)
    rows = []
    for name, causal_lm in models.items():
        path = engine_rate.export(causal_lm, name)
        with open(os.path.join(path, "manifest.json")) as f:
            stored = json.load(f)["weights"]["bytes"]
        started, rate, _ = engine_rate.measure(path, prompts, args.max_tokens)
        rows.append((name, stored, started, rate))
    engine_rate.print_table(
        args,
        ["weights", "stored bytes", "vs float32", "engine start (s)",
         "output tok/s"],
        [[name, str(stored), f"{stored / rows[0][1]:.2f}", f"{started:.1f}",
          f"{rate:.1f}"] for name, stored, started, rate in rows],
    )


if __name__ == "__main__":
    main()
