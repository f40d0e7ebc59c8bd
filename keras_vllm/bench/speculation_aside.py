"""Speculation that steps aside: decode rates of engines side by side.

```
python -m keras_vllm.bench.speculation_aside                 # --model tiny
python -m keras_vllm.bench.speculation_aside --workloads varied --floor 0.6
```

For each workload of `keras_vllm.bench.speculative` (`repeating`: every
n-gram draft accepted once the output repeats; `varied`: few are), one
artifact served by several engines in this process at once (vLLM's
in-process mode), whose timed runs are interleaved (engine after engine,
concurrency after concurrency, `--repeats` rounds) so that a host whose
speed drifts slows them alike; each cell is the fastest round:

- `plain`: no speculation (vLLM's default asynchronous scheduling);
- `plain, sync`: no speculation, `async_scheduling=False` (what vLLM runs
  a speculating n-gram engine with);
- `n-gram`: `speculative.SPECULATIVE_CONFIG`, drafting every step;
- `n-gram, floor`: the same with
  `additional_config={"min_draft_acceptance": FLOOR}`
  (`serve/worker/draft_schedule.py`);
- `n-gram, schedule`: the same with vLLM's
  `num_speculative_tokens_per_batch_size` from `--schedule` (JSON).

Decode rate = tokens of `1 + n` new tokens minus the prefill run's, per
second, on 32-token random prompts; every engine's greedy outputs are
compared with the first one's.
"""

import argparse
import json
import os

from keras_vllm.bench import engine_rate
from keras_vllm.bench import models
from keras_vllm.bench import speculative

DEFAULT_SCHEDULE = [[1, 8, 4], [9, 1024, 0]]


def variants(floor, schedule):
    """`{name: KerasVllmEngine.from_export keyword arguments}`."""
    ngram = {"speculative_config": speculative.SPECULATIVE_CONFIG}
    return {
        "plain": {},
        "plain, sync": {"async_scheduling": False},
        "n-gram": ngram,
        "n-gram, floor": dict(
            ngram, additional_config={"min_draft_acceptance": floor}
        ),
        "n-gram, schedule": {"speculative_config": dict(
            speculative.SPECULATIVE_CONFIG,
            num_speculative_tokens_per_batch_size=schedule,
        )},
    }


def measure(path, vocabulary, engines_kwargs, concurrencies, new_tokens,
            repeats):
    """`{name: {concurrency: (decode tok/s, outputs)}}`, interleaved."""
    import numpy as np
    import keras_vllm

    engines = {}
    for name, kwargs in engines_kwargs.items():
        os.environ["VLLM_XLA_CACHE_PATH"] = engine_rate.temporary_directory()
        engines[name] = keras_vllm.KerasVllmEngine.from_export(
            path, verbose=False, max_num_seqs=max(concurrencies),
            enable_prefix_caching=False, **kwargs,
        )
    rng = np.random.default_rng(0)
    prompts = {
        c: [{"prompt_token_ids": rng.integers(0, vocabulary, 32).tolist()}
            for _ in range(c)]
        for c in concurrencies
    }

    def run(engine, concurrency, tokens):
        seconds, outputs = speculative.run(engine, prompts[concurrency], tokens)
        return seconds, [list(o.outputs[0].token_ids) for o in outputs]

    best = {}
    try:
        for engine in engines.values():  # compiles
            for c in concurrencies:
                run(engine, c, 1)
                run(engine, c, 1 + new_tokens)
        for _ in range(repeats):
            for c in concurrencies:
                for name, engine in engines.items():
                    first, _ = run(engine, c, 1)
                    seconds, outputs = run(engine, c, 1 + new_tokens)
                    old = best.get((name, c))
                    if old is None or seconds - first < old[0]:
                        best[(name, c)] = (seconds - first, outputs)
    finally:
        for engine in engines.values():
            engine.shutdown()
    return {
        name: {c: (c * new_tokens / best[(name, c)][0], best[(name, c)][1])
               for c in concurrencies}
        for name in engines
    }


def table(workload, results):
    """Markdown rows: rates, each engine's ratio to `plain`, and whether
    every engine's outputs equal the first one's."""
    names = list(results)
    header = (["workload", "concurrency"] + [f"{n} tok/s" for n in names]
              + [f"{n} / {names[0]}" for n in names[1:]] + ["outputs equal"])
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in results[names[0]]:
        rates = [results[n][c][0] for n in names]
        same = all(results[n][c][1] == results[names[0]][c][1] for n in names)
        rows.append("| " + " | ".join(
            [workload, str(c)] + [f"{r:.0f}" for r in rates]
            + [f"{r / rates[0]:.2f}" for r in rates[1:]]
            + ["yes" if same else "NO"]
        ) + " |")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=sorted(models.MODELS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrencies", default="1,8,32")
    parser.add_argument("--workloads", default=",".join(speculative.WORKLOADS))
    parser.add_argument("--floor", type=float, default=0.6)
    parser.add_argument("--schedule", type=json.loads, default=DEFAULT_SCHEDULE)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault(
        "KERAS_VLLM_CPU_MEMORY_GB", models.CPU_MEMORY_GB[args.model]
    )
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows = []
    for workload in args.workloads.split(","):
        path, vocabulary = speculative.workload_artifact(args.model, workload)
        results = measure(
            path, vocabulary, variants(args.floor, args.schedule),
            concurrencies, args.new_tokens, args.repeats,
        )
        rows += table(workload, results)[0 if not rows else 2:]
    print(f"\n--model {args.model}, {args.new_tokens} new tokens, fastest of "
          f"{args.repeats} interleaved rounds; n-gram "
          f"{speculative.SPECULATIVE_CONFIG}, floor {args.floor}, schedule "
          f"{args.schedule}; load average at the end: {os.getloadavg()}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
