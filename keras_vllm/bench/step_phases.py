"""Where one decode step's time goes: a table per phase and concurrency.

```
python -m keras_vllm.bench.step_phases                     # --model tiny
python -m keras_vllm.bench.step_phases --model medium --concurrencies 1,8,32
python -m keras_vllm.bench.step_phases --engine-args '{"async_scheduling": false}'
```

An engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM's
front end, its engine core and tpu-inference's runner on one thread, the
way keras-vllm's TPU tier and benchmarks run it) serves `c` requests of
random 32-token prompts, greedy, `--new-tokens` each. Host timers wrap the
functions one step runs, in call order:

| phase | function | whose code |
| --- | --- | --- |
| schedule | `Scheduler.schedule` | vLLM |
| prepare inputs | `TPUModelRunner._prepare_inputs` | tpu-inference |
| model dispatch | the runner's jitted `model_fn` (the keras-vllm model inside) | keras-vllm's model, JAX dispatch |
| logits dispatch | the runner's jitted `compute_logits_fn` | keras-vllm's head, JAX dispatch |
| execute, rest | the rest of `TPUModelRunner.execute_model` | tpu-inference |
| sample + to host | `TPUModelRunner.sample_tokens` (waits for the device: the step's device time lands here) | tpu-inference |
| update | `Scheduler.update_from_output` | vLLM |
| outputs | `OutputProcessor.process_outputs` (detokenizing with keras-vllm's tokenizer adapter) | vLLM, keras-vllm's tokenizer |
| step, other | the rest of `LLMEngine.step` | vLLM |

Each cell is the median over the steps in which every request decodes
(no prefill), in milliseconds; the last rows give the step and its rate.
JAX dispatches asynchronously: the model's device time shows in the phase
that first waits for its result (sample + to host), not in its dispatch.
Timers cost ~1 us a call; nothing else changes.
"""

import argparse
import collections
import contextlib
import json
import os
import statistics
import time

from keras_vllm.bench import engine_rate
from keras_vllm.bench import models

PROMPT_TOKENS = 32

# (phase, module, class, method): timed as `phase` while the step runs.
_METHODS = (
    ("schedule", "vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("prepare inputs", "tpu_inference.runner.tpu_runner", "TPUModelRunner",
     "_prepare_inputs"),
    ("execute", "tpu_inference.runner.tpu_runner", "TPUModelRunner",
     "execute_model"),
    ("sample + to host", "tpu_inference.runner.tpu_runner", "TPUModelRunner",
     "sample_tokens"),
    ("update", "vllm.v1.core.sched.scheduler", "Scheduler",
     "update_from_output"),
    ("outputs", "vllm.v1.engine.output_processor", "OutputProcessor",
     "process_outputs"),
    ("step", "vllm.v1.engine.llm_engine", "LLMEngine", "step"),
)
# Runner attributes holding jitted functions, timed per call.
_RUNNER_FUNCTIONS = (("model dispatch", "model_fn"),
                     ("logits dispatch", "compute_logits_fn"))
PHASES = ("schedule", "prepare inputs", "model dispatch", "logits dispatch",
          "execute, rest", "sample + to host", "update", "outputs",
          "step, other")


class StepTimer:
    """Seconds per phase for each engine step (`steps`), and whether the
    step only decoded."""

    def __init__(self):
        self.steps = []
        self._current = None

    def add(self, phase, seconds):
        if self._current is not None:
            self._current[phase] += seconds

    def timed(self, phase, function):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - start)

        return wrapper

    @contextlib.contextmanager
    def installed(self, runner):
        """Times the engine's step functions and `runner`'s jitted ones."""
        import importlib

        saved = []
        for phase, module, cls, name in _METHODS:
            owner = getattr(importlib.import_module(module), cls)
            saved.append((owner, name, owner.__dict__[name]))
            timed = self.timed(phase, owner.__dict__[name])
            if phase == "step":
                timed = self._step(timed)
            if phase == "schedule":
                timed = self._schedule(timed)
            setattr(owner, name, timed)
        for phase, name in _RUNNER_FUNCTIONS:
            saved.append((runner, name, getattr(runner, name)))
            setattr(runner, name, self.timed(phase, getattr(runner, name)))
        try:
            yield self
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)

    def _step(self, step):
        def wrapper(*args, **kwargs):
            self._current = collections.defaultdict(float)
            self._current["decode only"] = False
            try:
                return step(*args, **kwargs)
            finally:
                self.steps.append(self._current)
                self._current = None

        return wrapper

    def _schedule(self, schedule):
        def wrapper(*args, **kwargs):
            out = schedule(*args, **kwargs)
            if self._current is not None:
                counts = out.num_scheduled_tokens.values()
                self._current["decode only"] = bool(counts) and all(
                    n == 1 for n in counts
                )
                self._current["requests"] = len(counts)
            return out

        return wrapper


def phase_medians(steps, concurrency):
    """Median milliseconds per phase over the decode-only steps of
    `concurrency` requests."""
    chosen = [s for s in steps
              if s["decode only"] and s["requests"] == concurrency]
    if not chosen:
        raise RuntimeError(f"no decode-only step of {concurrency} requests")
    rows = {}
    for phase in PHASES:
        values = []
        for s in chosen:
            if phase == "execute, rest":
                value = (s["execute"] - s["prepare inputs"]
                         - s["model dispatch"] - s["logits dispatch"])
            elif phase == "step, other":
                value = s["step"] - sum(
                    s[p] for p in ("schedule", "execute", "sample + to host",
                                   "update", "outputs"))
            else:
                value = s[phase]
            values.append(value * 1e3)
        rows[phase] = statistics.median(values)
    rows["step"] = statistics.median(s["step"] * 1e3 for s in chosen)
    rows["steps"] = len(chosen)
    return rows


def measure(path, vocabulary, concurrencies, new_tokens, **engine_kwargs):
    """`{concurrency: phase_medians(...)}` for one engine on `path`
    (`engine_kwargs`: more `vllm.LLM` arguments)."""
    import numpy as np
    from vllm import SamplingParams

    import keras_vllm

    engine = keras_vllm.KerasVllmEngine.from_export(
        path, verbose=False, max_num_seqs=max(16, max(concurrencies)),
        enable_prefix_caching=False, **engine_kwargs,
    )
    runner = engine.llm.llm_engine.engine_core.engine_core.model_executor.\
        driver_worker.worker.model_runner
    params = SamplingParams(
        temperature=0.0, max_tokens=new_tokens, ignore_eos=True
    )
    rng = np.random.default_rng(0)

    def prompts(count):
        return [{"prompt_token_ids":
                 rng.integers(0, vocabulary, PROMPT_TOKENS).tolist()}
                for _ in range(count)]

    results = {}
    try:
        for c in concurrencies:
            engine.generate(prompts(c), params, use_tqdm=False)  # compiles
            timer = StepTimer()
            with timer.installed(runner):
                engine.generate(prompts(c), params, use_tqdm=False)
            results[c] = phase_medians(timer.steps, c)
    finally:
        engine.shutdown()
    return results


def table(results):
    """Markdown rows: a phase per row, a concurrency per column."""
    columns = list(results)
    lines = ["| phase (median ms per decode step) | "
             + " | ".join(f"c={c}" for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for phase in PHASES + ("step",):
        lines.append(f"| {phase} | " + " | ".join(
            f"{results[c][phase]:.3f}" for c in columns) + " |")
    lines.append("| decode tok/s (c / step) | " + " | ".join(
        f"{c / results[c]['step'] * 1e3:.0f}" for c in columns) + " |")
    lines.append("| steps measured | " + " | ".join(
        str(results[c]["steps"]) for c in columns) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=sorted(models.MODELS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrencies", default="1,8,32")
    parser.add_argument("--engine-args", default="{}",
                        help="JSON: more vllm.LLM arguments for the engine")
    args = parser.parse_args()
    engine_kwargs = json.loads(args.engine_args)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault(
        "KERAS_VLLM_CPU_MEMORY_GB", models.CPU_MEMORY_GB[args.model]
    )
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    model = models.build(args.model)
    models.perturb(model)
    tokenizer = model.preprocessor.tokenizer
    special = [int(i) for i in tokenizer.special_token_ids]
    vocabulary = min(special) if special else tokenizer.vocabulary_size()
    path = engine_rate.export(model)
    del model
    results = measure(
        path, vocabulary, concurrencies, args.new_tokens, **engine_kwargs
    )
    print(f"\n--model {args.model}, {args.new_tokens} new tokens after a "
          f"{PROMPT_TOKENS}-token prompt, in-process engine "
          f"{engine_kwargs or ''}; load average "
          f"{os.getloadavg()}")
    print(table(results))


if __name__ == "__main__":
    main()
