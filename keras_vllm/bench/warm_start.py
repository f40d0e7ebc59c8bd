"""Cold vs warm engine starts on vLLM's persistent compile cache.

```
python -m keras_vllm.bench.warm_start [--family qwen] [--model bench|medium|tiny]
```

Exports one model, then starts an engine on it in a fresh process four
times, each timed from process start to the first generated token, with the
product's warm-up (every token and request bucket precompiled on a cold
start; a warm one loads its programs on first use, `serve/worker/warm_start.py`).
The engine has the throughput benchmark's settings (`--engine bench`: 32
sequences, 2048 tokens a step, 544 positions, `measure.ENGINE_ARGS`) or
`from_export`'s CPU defaults (`--engine product`: 16 sequences, 512 tokens
a step):

- `cold` / `warm`: an empty cache directory, then the same one again
  (keras-vllm's setting: every program is cached);
- `cold, jax default` / `warm, jax default`: the same with JAX's own 1 s
  compile-time threshold (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1`),
  i.e. what tpu-inference alone gives.

Prints a table: seconds to first token, warm / cold, and the cache's entries.
"""

import argparse
import os
import time

from keras_vllm.bench import engine_rate


def _engine_kwargs(engine):
    if engine == "product":
        return {}
    from keras_vllm.bench import measure

    return dict(measure.ENGINE_ARGS, max_num_seqs=32)


def _worker(path, engine_settings):
    t_spawn = float(os.environ["KERAS_VLLM_BENCH_SPAWN"])
    import keras_vllm
    from vllm import SamplingParams

    t_import = time.time()
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, verbose=False, **_engine_kwargs(engine_settings)
    )
    t_ready = time.time()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    engine.generate([{"prompt_token_ids": [1, 2, 3, 4]}], params, use_tqdm=False)
    t_first = time.time()
    engine.shutdown()
    engine_rate.print_result(
        {
            "first_token_s": t_first - t_spawn,
            "engine_start_s": t_ready - t_import,
        }
    )


def _start(path, cache, threshold, engine):
    env = dict(os.environ, VLLM_XLA_CACHE_PATH=cache)
    env["KERAS_VLLM_BENCH_SPAWN"] = repr(time.time())
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("SKIP_JAX_PRECOMPILE", None)
    if threshold is None:
        env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    else:
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(threshold)
    out = engine_rate.run_module(
        "keras_vllm.bench.warm_start",
        ["--worker", path, "--engine", engine], env=env,
    )
    out["entries"] = len(os.listdir(cache)) if os.path.isdir(cache) else 0
    return out


def _model(args):
    from keras_vllm import testing

    if args.model == "tiny":
        return testing.build_tiny_causal_lm(args.family)
    from keras_vllm.bench import models

    # "bench": the benchmark's own tiny model; "medium": its ~128M one.
    return models.build("tiny" if args.model == "bench" else args.model)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen")
    parser.add_argument("--model", choices=("bench", "medium", "tiny"), default="bench")
    parser.add_argument("--engine", choices=("bench", "product"),
                        default="bench")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        return _worker(args.worker, args.engine)

    root = engine_rate.temporary_directory()
    path = os.path.join(root, "artifact")
    # The throughput benchmark's positions (512-token prompts + 32 new).
    _model(args).export_vllm(path, max_sequence_length=544, golden_prompts=[])
    rows = []
    for label, threshold in (("", None), (", jax default", 1)):
        cache = os.path.join(root, "cache" + str(threshold))
        cold = _start(path, cache, threshold, args.engine)
        warm = _start(path, cache, threshold, args.engine)
        rows.append(("cold" + label, cold, cold))
        rows.append(("warm" + label, warm, cold))
    print(f"\n{args.model} model ({args.family}), {args.engine} engine "
          "settings, product warm-up, this host")
    print("| start | to first token (s) | engine start (s) | vs cold | cache entries |")
    print("|---|---|---|---|---|")
    for label, row, cold in rows:
        print(
            f"| {label} | {row['first_token_s']:.1f} | "
            f"{row['engine_start_s']:.1f} | "
            f"{row['first_token_s'] / cold['first_token_s']:.2f} | "
            f"{row['entries']} |"
        )


if __name__ == "__main__":
    main()
