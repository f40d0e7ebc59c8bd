"""The benchmark's command line: `keras-vllm bench` and `python -m
keras_vllm.bench` both run `main` (see the package docstring)."""

import argparse
import json
import os
import platform
import sys
import time

from keras_vllm.bench import cells as cells_lib
from keras_vllm.bench import engine_rate
from keras_vllm.bench import measure
from keras_vllm.bench import mixed
from keras_vllm.bench import models
from keras_vllm.bench import report
from keras_vllm.bench import workers
from keras_vllm.bench.report import SYSTEMS
def _environment():
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def main(argv=None):
    """Runs the benchmark (or, with the hidden `--worker`, one worker).

    Args:
        argv: list of strings, optional. The arguments (default:
            `sys.argv[1:]`).

    Returns:
        The exit status: 0 when every system ran.
    """
    parser = argparse.ArgumentParser(
        prog="keras-vllm bench",
        description="The A/B/C-seed/C serving benchmark, on one set of "
        "weights (see docs/benchmarks.md).")
    parser.add_argument("--quick", action="store_true",
                        help=f"cells {cells_lib.QUICK_PROMPT_LENGTHS} x "
                        f"{cells_lib.QUICK_CONCURRENCIES} instead of "
                        f"{cells_lib.PROMPT_LENGTHS} x "
                        f"{cells_lib.CONCURRENCIES}")
    parser.add_argument("--out", default="bench/results.json")
    parser.add_argument("--workdir", default=None,
                        help="keep the models and logs here "
                        "(default: a temporary directory)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated subset of A,B,C-seed,C")
    parser.add_argument("--prompt-lengths", default=None,
                        help="e.g. 32,512 (overrides --quick)")
    parser.add_argument("--concurrencies", default=None,
                        help="e.g. 1,16,32,64 (overrides --quick)")
    parser.add_argument("--max-tokens", type=int,
                        default=cells_lib.MAX_TOKENS)
    parser.add_argument("--reps", type=int, default=1,
                        help="timed batches per cell")
    parser.add_argument("--engine-mode", choices=("inproc", "default"),
                        default="inproc")
    parser.add_argument("--model", choices=sorted(models.MODELS),
                        default="tiny",
                        help="tiny: a 2.49M-parameter Qwen2; medium: 128.4M")
    parser.add_argument("--mixed", type=int, default=0, metavar="N",
                        help="also a mixed workload: N requests of long-"
                        "tailed prompt and output lengths, all at once "
                        "(A: static batches of the largest concurrency)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return workers.worker(args.worker, args.spec, args.result)

    lengths = cells_lib.PROMPT_LENGTHS
    concs = cells_lib.CONCURRENCIES
    if args.quick:
        lengths = cells_lib.QUICK_PROMPT_LENGTHS
        concs = cells_lib.QUICK_CONCURRENCIES
    if args.prompt_lengths:
        lengths = [int(x) for x in args.prompt_lengths.split(",")]
    if args.concurrencies:
        concs = [int(x) for x in args.concurrencies.split(",")]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}")
    cells = cells_lib.make_cells(lengths, concs)
    max_model_len = max(lengths) + args.max_tokens
    workdir = args.workdir or engine_rate.temporary_directory()
    os.makedirs(workdir, exist_ok=True)
    workdir = os.path.abspath(workdir)
    config = {
        "cells": cells,
        "max_tokens": args.max_tokens,
        "reps": args.reps,
        "engine_mode": args.engine_mode,
        "mixed": args.mixed,
        "engine_args": dict(measure.ENGINE_ARGS, max_model_len=max_model_len,
                            max_num_seqs=max(concs),
                            dtype=models.dtype(args.model)),
        "cpu_memory_gb": models.CPU_MEMORY_GB[args.model],
        "model": models.config(args.model),
        # `keras-vllm bench` and `python -m keras_vllm.bench` run the same.
        "command": " ".join(["keras-vllm bench"]
                            + (argv if argv is not None else sys.argv[1:])),
    }
    env = {
        "KERAS_VLLM_CPU_MEMORY_GB": models.CPU_MEMORY_GB[args.model],
        # Cold compiles: engine start and first token are measured as a
        # fresh host would see them.
        "VLLM_DISABLE_COMPILE_CACHE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    spec = {
        "workdir": workdir,
        "max_model_len": max_model_len,
        "max_num_seqs": max(concs),
        "max_tokens": args.max_tokens,
        "engine_mode": args.engine_mode,
        "model": args.model,
    }
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    t0 = time.time()
    prepared = workers.run_worker("prepare", spec_path, workdir, env,
                                  workers.WORKER_TIMEOUT_S)
    if not prepared.get("ok"):
        return 1
    for key, value in prepared["exports"].items():
        print(f"[bench] export {key}: {value['seconds']:.2f} s, "
              f"{value['bytes']} bytes", flush=True)
    first_id, limit = prepared["model"]["prompt_ids"]
    prompts = cells_lib.make_prompts(cells, limit, reps=args.reps,
                                     first_id=first_id)
    if args.mixed:
        shape = dict(vocab_size=limit, first_id=first_id,
                     max_prompt=max(lengths), max_output=args.max_tokens)
        prompts["mixed"] = {
            "batch_size": max(concs),
            "workload": mixed.mixed_workload(args.mixed, seed=1, **shape),
            "warmup": mixed.mixed_workload(args.mixed, seed=2, **shape),
        }
    prompts_file = os.path.join(workdir, "prompts.json")
    with open(prompts_file, "w") as f:
        json.dump(prompts, f)
    spec.update(paths=prepared["paths"], prompts_file=prompts_file)
    with open(spec_path, "w") as f:
        json.dump(spec, f)

    results = {}
    for name in systems:
        worker_env = dict(env)
        if name == "C-seed" or (name != "A" and args.engine_mode == "inproc"):
            worker_env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        results[name] = workers.run_worker(
            name, spec_path, workdir, worker_env, workers.WORKER_TIMEOUT_S)
        # Keep partial results on disk as the run goes.
        doc = report.assemble(config, results, prepared, _environment())
        report.write(args.out, doc)
    doc = report.assemble(config, results, prepared, _environment())
    doc["environment"]["versions"] = next(
        (r["versions"] for r in results.values() if r.get("versions")), {})
    doc["environment"]["total_wall_s"] = time.time() - t0
    doc["environment"]["workdir"] = workdir
    report.check_results(doc)
    report.write(args.out, doc)
    print()
    print(report.format_report(doc))
    print(f"\n[bench] wrote {args.out} ({time.time() - t0:.0f} s)")
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
