"""Stored weight bytes, engine start and output tokens/s of one model in
float32, bfloat16 and Keras int8, on this host.

```
python bench/quantized.py --family llama --prompts 16 --max-tokens 64
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
import tempfile
import time


def _serve(path, prompts, max_tokens):
    import keras_vllm
    from vllm import SamplingParams

    start = time.perf_counter()
    engine = keras_vllm.KerasVllmEngine.from_export(path, verbose=False)
    started = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.generate(prompts[:2], params, use_tqdm=False)  # first-call costs
    start = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    engine.shutdown()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return started, tokens / seconds


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
    corpus = testing.corpus()
    prompts = [corpus[i % len(corpus)] for i in range(args.prompts)]
    rows = []
    for name, causal_lm in models.items():
        path = os.path.join(tempfile.mkdtemp(), name)
        causal_lm.export_vllm(path, max_sequence_length=256, golden_prompts=[])
        with open(os.path.join(path, "manifest.json")) as f:
            stored = json.load(f)["weights"]["bytes"]
        started, rate = _serve(path, prompts, args.max_tokens)
        rows.append((name, stored, started, rate))
    print(f"\n{args.family}, {args.prompts} prompts x {args.max_tokens} tokens")
    print("| weights | stored bytes | vs float32 | engine start (s) | output tok/s |")
    print("|---|---|---|---|---|")
    for name, stored, started, rate in rows:
        print(
            f"| {name} | {stored} | {stored / rows[0][1]:.2f} | "
            f"{started:.1f} | {rate:.1f} |"
        )


if __name__ == "__main__":
    main()
