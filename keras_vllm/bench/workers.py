"""The worker processes: each system (and the preparation) runs in its own
subprocess, `python -m keras_vllm.bench --worker NAME`, so no two engines
share a JAX runtime or memory; the parent collects each worker's JSON."""

import json
import os
import signal
import subprocess
import sys
import time

from keras_vllm.bench import measure
from keras_vllm.bench import models
from keras_vllm.bench import prepare

WORKER_TIMEOUT_S = 1800


def worker(name, spec_path, result_path):
    """One worker process's work: `name` is "prepare" or a system.

    Reads the spec the parent wrote, writes the result JSON to
    `result_path` and exits the process (it does not return).
    """
    t_spawn = float(os.environ.get("KERAS_VLLM_BENCH_SPAWN", time.time()))
    # Before anything imports keras (keras_hub does).
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("KERAS_NNX_ENABLED", "true")
    with open(spec_path) as f:
        spec = json.load(f)
    if name == "prepare":
        # `model` is absent from specs written before models were named.
        result = prepare.prepare(spec["workdir"], spec["max_model_len"],
                                 spec.get("model", "tiny"))
    else:
        with open(spec["prompts_file"]) as f:
            prompts = json.load(f)
        if name == "A":
            import keras_hub

            import keras_vllm  # noqa: F401  (environment)

            start = time.time()
            causal_lm = keras_hub.models.CausalLM.from_preset(
                spec["paths"]["preset"],
                dtype=models.dtype(spec.get("model", "tiny")),
            )
            causal_lm.compile(sampler="greedy")
            loaded = time.time()
            # First token: `generate()` compiles for the shape on this call.
            measure.keras_generate(causal_lm, [prompts["ttft"]], 1)
            startup = {
                "load_s": loaded - start,
                "process_start_to_first_token_s": time.time() - t_spawn,
                "first_request_s": time.time() - loaded,
            }
            result = measure.measure_keras(causal_lm, prompts,
                                           spec["max_tokens"])
            result["startup"] = startup
        else:
            result = measure.measure_engine(name, spec, prompts, t_spawn)
    result["versions"] = _versions()
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    # Skip interpreter teardown (vLLM/JAX threads can hang at exit).
    os._exit(0)


def _versions():
    from importlib import metadata

    out = {}
    for name in ("keras", "keras-hub", "jax", "flax", "vllm-tpu",
                 "tpu-inference", "transformers", "torch", "keras-vllm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_worker(name, spec_path, workdir, env_extra, timeout):
    """Runs one worker to its end and returns its result (or its failure).

    The worker is the package's module (`python -m keras_vllm.bench`), so
    it runs wherever keras-vllm is installed. Its process group is killed
    afterwards: engine processes it may have left behind go with it.
    """
    result_path = os.path.join(workdir, f"result_{name}.json")
    log_path = os.path.join(workdir, f"log_{name}.txt")
    if os.path.exists(result_path):
        os.remove(result_path)
    env = dict(os.environ)
    env.update(env_extra)
    env["KERAS_VLLM_BENCH_SPAWN"] = repr(time.time())
    command = [sys.executable, "-m", "keras_vllm.bench", "--worker", name,
               "--spec", spec_path, "--result", result_path]
    start = time.time()
    print(f"[bench] {name}: running (log: {log_path})", flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = "timeout"
        else:
            # Engine processes the worker may have left behind.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wall = time.time() - start
    if code == 0 and os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
        result["ok"] = True
    else:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        result = {"ok": False, "error": f"exit {code}", "log_tail": tail}
        print(f"[bench] {name}: FAILED ({code}); log tail:\n{tail}",
              flush=True)
    result["wall_s"] = wall
    print(f"[bench] {name}: done in {wall:.0f} s", flush=True)
    return result

