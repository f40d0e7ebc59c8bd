"""Engine start time and output tokens/s of each family's tiny model, one
cold engine per family, for the families added since the 2023-25 set.

```
python -m keras_vllm.bench.families --families llama,smollm3,gpt_oss,gemma4,gemma4_e2b
```

Each family runs in its own fresh process with its own empty vLLM cache
directory, so the start counts what a first `KerasVllmEngine.from_export`
pays on a new host (vLLM's start-up, the weights' load, every program's
compile, the product's warm-up). The model is the tiny random KerasHub
model of the family the tests train (`testing.build_tiny_causal_lm`),
exported with 256 positions. Two rates follow: one request alone
(`c=1`, decode-bound) and `--prompts` requests submitted at once.
Llama is the reference row: the same tiny sizes, a 2023 architecture.
"""

import argparse
import os

from keras_vllm.bench import engine_rate

DEFAULT_FAMILIES = "llama,smollm3,gpt_oss,gemma4,gemma4_e2b"


def _rate(engine, prompts, max_tokens):
    import time

    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True
    )
    start = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds


def _worker(family, prompts, max_tokens):
    """One family in this (fresh) process: export, start, warm, time."""
    import time

    import keras_vllm
    from keras_vllm import testing

    path = engine_rate.export(testing.build_tiny_causal_lm(family), family)
    corpus = engine_rate.corpus_prompts(prompts)
    start = time.perf_counter()
    engine = keras_vllm.KerasVllmEngine.from_export(path, verbose=False)
    started = time.perf_counter() - start
    # First calls of each batch shape pay their remaining costs untimed.
    _rate(engine, corpus[:1], 4)
    _rate(engine, corpus, 4)
    single = _rate(engine, corpus[:1], max_tokens)
    batched = _rate(engine, corpus, max_tokens)
    engine.shutdown()
    engine_rate.print_result(
        {"start": started, "single": single, "batched": batched}
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=DEFAULT_FAMILIES)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.prompts, args.max_tokens)
        return
    rows = []
    for family in args.families.split(","):
        env = dict(os.environ)
        # A cache of its own: no program compiled by an earlier run counts.
        env["VLLM_CACHE_ROOT"] = engine_rate.temporary_directory()
        result = engine_rate.run_module(
            "keras_vllm.bench.families",
            ["--worker", family, "--prompts", str(args.prompts),
             "--max-tokens", str(args.max_tokens)],
            env=env,
        )
        rows.append([
            family, f"{result['start']:.1f}", f"{result['single']:.1f}",
            f"{result['batched']:.1f}",
        ])
    args.family = "tiny models, one cold engine each"
    engine_rate.print_table(
        args,
        ["family", "engine start (s)", "output tok/s, c=1",
         f"output tok/s, c={args.prompts}"],
        rows,
    )


if __name__ == "__main__":
    main()
