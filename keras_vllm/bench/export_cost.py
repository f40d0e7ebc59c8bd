"""Export and load cost against Keras' own: time and peak memory.

`python -m keras_vllm.bench.export_cost [--model medium] [--reps 2]` builds
the benchmark model (float32), saves it as a Keras preset, and then times,
each in a fresh process so that one operation's memory and compile caches
do not carry into the next:

- `save_to_preset` against `export_vllm(weights="full")`, with the default
  golden outputs and without them (`golden_prompts=()`);
- `CausalLM.from_preset` against `keras_vllm.load_causal_lm`.

Peak memory is the process's resident set sampled every 5 ms during the
operation, less the resident set before it, reported as a share of the
weights' bytes. Issue #15's goals: export <= 1.5x `save_to_preset`, load <=
1.2x `from_preset`, export's peak memory <= 1.2x the model's own (extra <=
0.2x the weights).
"""

import argparse
import os
import tempfile
import threading
import time

from keras_vllm.bench import engine_rate

OPERATIONS = (
    "save_to_preset",
    "export_vllm",
    "export_vllm_no_golden",
    "from_preset",
    "load_causal_lm",
)


def _resident_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class _Peak:
    """Times a block and samples the resident set's high-water mark."""

    def __enter__(self):
        self.before = self.peak = _resident_bytes()
        self._done = threading.Event()

        def sample():
            while not self._done.wait(0.005):
                self.peak = max(self.peak, _resident_bytes())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info):
        self.seconds = time.perf_counter() - self._start
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, _resident_bytes())


def _operation(name, workdir):
    """Runs one operation in this process; returns its measurement."""
    import keras_hub

    import keras_vllm

    preset = os.path.join(workdir, "preset")
    artifact = os.path.join(workdir, "artifact")
    if name == "from_preset":
        with _Peak() as peak:
            keras_hub.models.CausalLM.from_preset(preset)
    elif name == "load_causal_lm":
        with _Peak() as peak:
            keras_vllm.load_causal_lm(artifact, verbose=False)
    else:
        causal_lm = keras_hub.models.CausalLM.from_preset(preset)
        # The export with golden outputs is the artifact `load_causal_lm`
        # reads next.
        target = (
            artifact if name == "export_vllm"
            else os.path.join(workdir, f"{name}_output")
        )
        kwargs = {"weights": "full", "overwrite": True, "verbose": False}
        with _Peak() as peak:
            if name == "save_to_preset":
                causal_lm.save_to_preset(target)
            elif name == "export_vllm":
                causal_lm.export_vllm(target, **kwargs)
            else:
                causal_lm.export_vllm(target, golden_prompts=(), **kwargs)
    return {"seconds": peak.seconds, "extra_bytes": peak.peak - peak.before}


def _prepare(model_name, workdir):
    from keras_vllm.bench import models

    causal_lm = models.build(model_name)
    causal_lm.save_to_preset(os.path.join(workdir, "preset"))
    weights = sum(v.numpy().nbytes for v in causal_lm.backbone.weights)
    return causal_lm.backbone.count_params(), weights


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="medium")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--operations",
        default=",".join(OPERATIONS),
        help="comma-separated subset of " + ",".join(OPERATIONS)
        + " (load_causal_lm reads export_vllm's artifact)",
    )
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = _operation(*args.worker)
        engine_rate.print_result(result)
        return
    operations = [n for n in OPERATIONS if n in args.operations.split(",")]
    unknown = set(args.operations.split(",")) - set(OPERATIONS)
    if unknown or (
        "load_causal_lm" in operations and "export_vllm" not in operations
    ):
        parser.error(
            f"--operations: unknown {sorted(unknown)}" if unknown
            else "--operations: load_causal_lm needs export_vllm"
        )
    with tempfile.TemporaryDirectory() as workdir:
        params, weight_bytes = _prepare(args.model, workdir)
        best = {}
        for _ in range(args.reps):
            for name in operations:
                result = engine_rate.run_module(
                    "keras_vllm.bench.export_cost", ["--worker", name, workdir]
                )
                if name not in best or result["seconds"] < best[name]["seconds"]:
                    best[name] = result
    print(f"\n{args.model}: {params:,} parameters, float32, "
          f"{weight_bytes / 1e6:.0f} MB of weights; best of {args.reps}")
    print("| operation | seconds | vs Keras | extra memory / weights |")
    print("|---|---|---|---|")
    keras = {"export_vllm": "save_to_preset",
             "export_vllm_no_golden": "save_to_preset",
             "load_causal_lm": "from_preset"}
    for name in operations:
        row = best[name]
        ratio = (
            f"{row['seconds'] / best[keras[name]]['seconds']:.2f}x"
            if keras.get(name) in best else ""
        )
        print(f"| {name} | {row['seconds']:.2f} | {ratio} | "
              f"{row['extra_bytes'] / weight_bytes:.2f} |")


if __name__ == "__main__":
    main()
