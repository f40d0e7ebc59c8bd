"""Where one decode step's time goes: a table per phase and concurrency.

```
python -m keras_vllm.bench.step_phases                     # --model tiny
python -m keras_vllm.bench.step_phases --model medium --concurrencies 1,8,32
python -m keras_vllm.bench.step_phases --engine-args '{"async_scheduling": false}'
python -m keras_vllm.bench.step_phases --systems C,B       # and tpu-inference's own model
python -m keras_vllm.bench.step_phases --engine-args '{}' \
    --engine-args '{"additional_config": {"enable_continue_decode": true}}'
```

An engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM's
front end, its engine core and tpu-inference's runner on one thread, the
way keras-vllm's TPU tier and benchmarks run it) serves `c` requests of
random 32-token prompts, greedy, `--new-tokens` each. System C is
keras-vllm on the model's export; B is vLLM serving the Hugging Face
checkpoint of the same weights (`export_to_transformers`) through
tpu-inference's own model class, the main benchmark's B: the same runner
and scheduler around another model, so the phases compare one to one.
Host timers wrap the functions one step runs, in call order:

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

The timers stay installed for the rest of the process (through
`keras_vllm.patching`; they record only while a measurement runs). Each
cell is the median over the steps in which every request decodes
(no prefill), in milliseconds; the last rows give the step, the tokens it
yields (more than one a request with tpu-inference's continue decode:
`--engine-args '{"additional_config": {"enable_continue_decode": true}}'`,
see `keras_vllm/serve/decode_steps.py`) and the decode rate.
JAX dispatches asynchronously: the model's device time shows in the phase
that first waits for its result (sample + to host), not in its dispatch.
So each concurrency runs once more with the model's and the head's calls
waiting for their results: the row "model + head, device" is their time
in that pass (dispatch and device compute), what the chip spends on a step
against the step's whole time. Timers cost ~1 us a call; nothing else
changes.
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
from keras_vllm.bench import prepare

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
    step only decoded; records only inside `recording()`."""

    def __init__(self):
        self.steps = []
        self._recording = False
        self._current = None
        # Whether the runner's jitted calls wait for their results.
        self.blocking = False

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

    def install(self, runner):
        """Times the engine's step functions (for the rest of this
        process, through `keras_vllm.patching`) and `runner`'s jitted
        ones."""
        import importlib

        from keras_vllm import patching

        for phase, module, cls, name in _METHODS:
            owner = getattr(importlib.import_module(module), cls)
            wrap = {"step": self._step, "schedule": self._schedule,
                    "update": self._update}.get(phase, lambda timed: timed)
            patching.replace(
                owner, name,
                lambda original, phase=phase, wrap=wrap: wrap(
                    self.timed(phase, original)
                ),
            )
        for phase, name in _RUNNER_FUNCTIONS:
            patching.replace(
                runner, name,
                lambda original, phase=phase: self.timed(
                    phase, self._waited(original)
                ),
            )

    def _waited(self, function):
        def wrapper(*args, **kwargs):
            out = function(*args, **kwargs)
            if self.blocking:
                import jax

                jax.block_until_ready(out)
            return out

        return wrapper

    @contextlib.contextmanager
    def recording(self):
        """Records the steps the block runs (into a fresh `steps`)."""
        self.steps, self._recording = [], True
        try:
            yield self
        finally:
            self._recording = False

    def _step(self, step):
        def wrapper(*args, **kwargs):
            if not self._recording:
                return step(*args, **kwargs)
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


    def _update(self, update):
        def wrapper(scheduler, scheduler_output, model_output, *args,
                    **kwargs):
            if self._current is not None:
                # Tokens the step yielded: one per request, or up to
                # `max_decode_steps` with continue decode.
                self._current["tokens"] += sum(
                    len(ids) for ids in model_output.sampled_token_ids
                )
            return update(scheduler, scheduler_output, model_output, *args,
                          **kwargs)

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
    rows["tokens per step"] = statistics.mean(
        s.get("tokens", concurrency) for s in chosen
    )
    rows["decode tok/s"] = sum(s.get("tokens", concurrency) for s in chosen) / (
        sum(s["step"] for s in chosen)
    )
    return rows


# One timer for the process: the engine's step functions are wrapped once
# (`keras_vllm.patching` applies a fix once), around this instance.
_TIMER = StepTimer()


def _in_process_runner(llm):
    return (llm.llm_engine.engine_core.engine_core.model_executor
            .driver_worker.worker.model_runner)


def _start(system, path, **engine_kwargs):
    """`(generate, runner, shutdown)` of system `system`'s engine on `path`
    (C: a keras-vllm artifact; B: a Hugging Face checkpoint)."""
    if system == "C":
        import keras_vllm

        engine = keras_vllm.KerasVllmEngine.from_export(
            path, verbose=False, **engine_kwargs
        )
        return (engine.generate, _in_process_runner(engine.llm),
                engine.shutdown)
    import gc

    import vllm

    llm = vllm.LLM(model=path, **engine_kwargs)

    def shutdown():
        llm.llm_engine.engine_core.shutdown()
        gc.collect()

    return llm.generate, _in_process_runner(llm), shutdown


def measure(path, prompt_ids, concurrencies, new_tokens, system="C",
            **engine_kwargs):
    """`{concurrency: phase_medians(...)}` for one engine on `path`
    (`engine_kwargs`: more `vllm.LLM` arguments)."""
    import numpy as np
    from vllm import SamplingParams

    generate, runner, shutdown = _start(
        system, path, max_num_seqs=max(16, max(concurrencies)),
        enable_prefix_caching=False, **engine_kwargs,
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=new_tokens, ignore_eos=True
    )
    # The same prompts for every system.
    rng = np.random.default_rng(0)

    def prompts(count):
        return [{"prompt_token_ids":
                 rng.integers(*prompt_ids, PROMPT_TOKENS).tolist()}
                for _ in range(count)]

    results = {}
    _TIMER.install(runner)
    try:
        for c in concurrencies:
            generate(prompts(c), params, use_tqdm=False)  # compiles
            with _TIMER.recording():
                generate(prompts(c), params, use_tqdm=False)
            results[c] = phase_medians(_TIMER.steps, c)
            _TIMER.blocking = True
            try:
                with _TIMER.recording():
                    generate(prompts(c), params, use_tqdm=False)
            finally:
                _TIMER.blocking = False
            waited = phase_medians(_TIMER.steps, c)
            results[c]["model + head, device"] = (
                waited["model dispatch"] + waited["logits dispatch"]
            )
    finally:
        shutdown()
    return results


def table(results):
    """Markdown rows: a phase per row, a concurrency per column."""
    columns = list(results)
    lines = ["| phase (median ms per decode step) | "
             + " | ".join(f"c={c}" for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    waited = ("model + head, device",) * all(
        "model + head, device" in results[c] for c in columns
    )
    for phase in PHASES + ("step",) + waited:
        lines.append(f"| {phase} | " + " | ".join(
            f"{results[c][phase]:.3f}" for c in columns) + " |")
    lines.append("| tokens per step | " + " | ".join(
        f"{results[c]['tokens per step']:.1f}" for c in columns) + " |")
    lines.append("| decode tok/s (tokens / step time) | " + " | ".join(
        f"{results[c]['decode tok/s']:.0f}" for c in columns) + " |")
    lines.append("| steps measured | " + " | ".join(
        str(results[c]["steps"]) for c in columns) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=sorted(models.MODELS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrencies", default="1,8,32")
    parser.add_argument("--engine-args", action="append",
                        help="JSON: more vllm.LLM arguments for the engine; "
                        "given twice or more, each system runs with each")
    parser.add_argument("--systems", default="C",
                        help="C (keras-vllm), B (tpu-inference's own model "
                        "on the HF checkpoint of the same weights), or both")
    args = parser.parse_args()
    variants = [json.loads(a) for a in args.engine_args or ["{}"]]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault(
        "KERAS_VLLM_CPU_MEMORY_GB", models.CPU_MEMORY_GB[args.model]
    )
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    systems = args.systems.split(",")
    model = models.build(args.model)
    models.perturb(model)
    prompt_ids = prepare.prompt_id_range(model.preprocessor.tokenizer)
    paths = {"C": engine_rate.export(model)}
    if "B" in systems:
        paths["B"] = os.path.join(engine_rate.temporary_directory(), "hf")
        model.export_to_transformers(paths["B"])
        prepare.fix_transformers_export(paths["B"], models.dtype(args.model))
    del model
    for engine_kwargs in variants:
        for system in systems:
            # B reads its length from the checkpoint's config: the export's.
            extra = {"max_model_len": 256} if system == "B" else {}
            heading = (f"\n{system}: --model {args.model}, {args.new_tokens} "
                       f"new tokens after a {PROMPT_TOKENS}-token prompt, "
                       f"in-process engine {engine_kwargs or ''}")
            try:
                results = measure(paths[system], prompt_ids, concurrencies,
                                  args.new_tokens, system, **extra,
                                  **engine_kwargs)
            except Exception as e:  # The other cells still run.
                print(f"{heading}: failed: {type(e).__name__}: {e}")
                continue
            print(f"{heading}; load average {os.getloadavg()}")
            print(table(results), flush=True)


if __name__ == "__main__":
    main()
