"""What the small benchmarks (`tensor_parallel`, `data_parallel`, `quantized`,
`adapters`, `warm_start`, `export_cost`) share: the prompts, an export, one engine's
start time and output rate, and one-shot worker processes.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_RESULT = "RESULT "


def corpus_prompts(count):
    """`count` prompts cycled from the test corpus."""
    from keras_vllm import testing

    corpus = testing.corpus()
    return [corpus[i % len(corpus)] for i in range(count)]


def temporary_directory(prefix="keras_vllm_bench_"):
    """A new temporary directory, removed when this process exits (each
    export here is hundreds of MB, and a host's disk is shared with CI)."""
    root = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def export(causal_lm, name="artifact"):
    """Exports `causal_lm` to a fresh temporary directory (256 positions,
    no golden outputs) and returns the path."""
    path = os.path.join(temporary_directory(), name)
    causal_lm.export_vllm(path, max_sequence_length=256, golden_prompts=[])
    return path


def measure(path, prompts, max_tokens, **engine_kwargs):
    """Starts an engine on `path`, warms it, and times one greedy batch.

    Returns:
        `(start_seconds, output_tokens_per_second, per_device_bytes)`.
    """
    import keras_vllm
    from vllm import SamplingParams

    start = time.perf_counter()
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, verbose=False, **engine_kwargs
    )
    started = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.generate(prompts[:2], params, use_tqdm=False)  # first-call costs
    start = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    layout = engine.weights_layout()
    engine.shutdown()
    return started, tokens / seconds, layout["devices"]


def size_arguments(description, prompts):
    """The command line of a benchmark over parallel sizes (`--family` or
    `--model`, `--sizes`, `--prompts`, `--max-tokens`), parsed."""
    import argparse

    from keras_vllm.bench import models

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--family", default="llama")
    parser.add_argument(
        "--model", choices=sorted(models.MODELS),
        help="one of the main benchmark's models (`bench.models`) instead "
        "of the family's tiny test model",
    )
    parser.add_argument("--sizes", default="1,2")
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--max-tokens", type=int, default=64)
    return parser.parse_args()


def measure_sizes(args, setting):
    """Exports a tiny model of `args.family` (or `args.model` of
    `bench.models`) once and measures an engine per size of `args.sizes`,
    passing `setting=size` to it.

    Returns:
        `[(size, start_seconds, output_tokens_per_second,
        per_device_bytes)]`.
    """
    from keras_vllm import testing
    from keras_vllm.bench import models

    if args.model:
        args.family = f"{args.model} model ({models.MODELS[args.model]['family']})"
        path = export(models.build(args.model))
    else:
        path = export(testing.build_tiny_causal_lm(args.family))
    prompts = corpus_prompts(args.prompts)
    return [
        (size, *measure(path, prompts, args.max_tokens, **{setting: size}))
        for size in [int(s) for s in args.sizes.split(",")]
    ]


def print_table(args, header, rows):
    """Prints the run's title (family, prompts, tokens) and a Markdown
    table: `header` and each row are lists of cell strings."""
    print(f"\n{args.family}, {args.prompts} prompts x {args.max_tokens} "
          "tokens")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


def print_result(result):
    """Prints a worker's result (a JSON-able dict) where `run_module`
    finds it, whatever else the worker's libraries print."""
    print(_RESULT + json.dumps(result), flush=True)


def run_module(module, args, env=None, timeout=1800):
    """Runs `python -m module *args` in a fresh process (the package's
    module: it runs wherever keras-vllm is installed) and returns the dict
    its last `print_result` line holds.

    Raises:
        RuntimeError: the worker failed or printed no result (with the end
            of its stderr).
    """
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    lines = [l for l in out.stdout.splitlines() if l.startswith(_RESULT)]
    if out.returncode or not lines:
        raise RuntimeError(
            f"{module} {' '.join(args)} failed:\n{out.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len(_RESULT):])
