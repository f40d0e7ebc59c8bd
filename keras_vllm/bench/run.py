"""The A/B/C-seed/C serving benchmark, on one set of weights.

    .venv/bin/python bench/run.py [--quick] [--out bench/results.json]
    .venv/bin/keras-vllm bench [--quick] [--out bench/results.json]   # same

One run builds a small KerasHub Qwen2 model (`QwenCausalLM`, offline, see
`MODEL`), writes it out in every format the systems read, and measures
output tokens/s for each (prompt length, concurrency) cell on:

- **A**      KerasHub `CausalLM.generate()` with static batches
             (batch = concurrency);
- **B**      tpu-inference's own Qwen2 (`Qwen2ForCausalLM`) under plain
             `vllm.LLM`, on `causal_lm.export_to_transformers(...)` output
             (fixed: `architectures` added, the duplicated tied
             `lm_head.weight` dropped);
- **C-seed** keras-hub's own `keras_hub.vllm.KerasHubLLM` on the model
             saved as a local preset;
- **C**      `keras_vllm.KerasVllmEngine.from_export` on our artifact.

Every system runs in its own subprocess (`--worker SYSTEM`), one after the
other, so no two engines share a JAX runtime or memory; this process only
prepares the work, collects each worker's JSON and prints the tables. The
model preparation (build, exports, a LoRA fine-tune) runs in a subprocess
too. Prompts are random token ids (every prompt distinct, so prefix caching
never hits; "words" = tokens), given as ids to every system; decoding is
greedy with a fixed number of new tokens and stop tokens ignored. Each cell
first runs one untimed warm-up batch of other prompts.

Also recorded: export time and bytes (ours, `save_to_preset`,
`export_to_transformers`), time from process start to the first generated
token per engine, artifact bytes after a LoRA fine-tune (delta vs full), the
time per decode step, and how many outputs match A's token for token.

The engines share one setting (`ENGINE_ARGS`): in-process EngineCore
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the only mode in which keras-hub
0.32's `KerasHubLLM` starts, see docs/benchmarks.md) and
`async_scheduling=False`; `--engine-mode default` runs B and C with
vLLM's defaults instead (C-seed stays in-process).

The functions below that do not start a worker (`make_cells`,
`make_prompts`, `measure_keras`, `assemble`, `format_report`,
`check_results`, `fix_transformers_export`) are tested without any vLLM
engine in tests/test_bench.py.
"""

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time

SCHEMA = "keras-vllm-bench/1"
SYSTEMS = ("A", "B", "C-seed", "C")
RATIOS = (("C/A", "C", "A"), ("C/B", "C", "B"), ("C/C-seed", "C", "C-seed"))

PROMPT_LENGTHS = (32, 512)
CONCURRENCIES = (1, 16, 32, 64)
QUICK_PROMPT_LENGTHS = (32, 512)
QUICK_CONCURRENCIES = (1, 16)
MAX_TOKENS = 32
# Decode steps timed for the per-step measurement (see `_step_times`).
STEP_TOKENS = 32

# The benchmark model: `keras_vllm.testing.build_tiny_causal_lm("qwen", ...)`
# overrides. head_dim = 256 / 4 = 64 (tpu-inference's hd64 cache layout).
MODEL = {
    "family": "qwen",
    "num_layers": 4,
    "hidden_dim": 256,
    "intermediate_dim": 512,
    "num_query_heads": 4,
    "num_key_value_heads": 2,
}

# vLLM engine arguments shared by B, C-seed and C (`max_model_len`,
# `max_num_seqs` are set per run from the cells).
ENGINE_ARGS = {
    "dtype": "float32",
    "max_num_batched_tokens": 2048,
    "gpu_memory_utilization": 0.5,
    "seed": 0,
}
# keras-vllm's CPU backend fakes this much device memory (GiB) per CPU
# device; with `gpu_memory_utilization` it sizes the (real, host) KV cache.
CPU_MEMORY_GB = "1"

WORKER_TIMEOUT_S = 1800


# ---------------------------------------------------------------------------
# Cells and prompts (pure Python).
# ---------------------------------------------------------------------------


def make_cells(prompt_lengths, concurrencies):
    """Returns the (prompt length, concurrency) cells, in table order."""
    return [
        {"prompt_len": int(n), "concurrency": int(c)}
        for n in prompt_lengths
        for c in concurrencies
    ]


def make_prompts(cells, vocab_size, *, reps=1, seed=0, step_concurrency=None):
    """Distinct random prompts (token id lists) for every cell and system.

    Each cell gets one warm-up batch and `reps` timed batches of
    `concurrency` prompts; the step measurement gets its own prompts. No two
    prompts share their first token pair *and* anything else: all prompts
    are distinct, so vLLM's prefix cache never hits.

    Args:
        cells: from `make_cells`.
        vocab_size: ids are drawn from `[0, vocab_size)` (pass the first
            special token id, so no prompt contains one).
        reps: timed batches per cell.
        seed: the random seed.
        step_concurrency: batch sizes of the per-step measurement (default:
            1 and the largest concurrency).

    Returns:
        `{"cells": [{"prompt_len", "concurrency", "warmup": [...],
        "timed": [[...], ...]}], "ttft": ids, "steps": {c: [...]}}`.
    """
    rng = random.Random(seed)
    seen = set()

    def prompt(length):
        while True:
            ids = tuple(rng.randrange(vocab_size) for _ in range(length))
            if ids not in seen:
                seen.add(ids)
                return list(ids)

    out = {"cells": []}
    for cell in cells:
        n, c = cell["prompt_len"], cell["concurrency"]
        out["cells"].append(
            dict(
                cell,
                warmup=[prompt(n) for _ in range(c)],
                timed=[[prompt(n) for _ in range(c)] for _ in range(reps)],
            )
        )
    short = min(cell["prompt_len"] for cell in cells)
    out["ttft"] = prompt(short)
    if step_concurrency is None:
        step_concurrency = sorted(
            {1, max(cell["concurrency"] for cell in cells)}
        )
    out["steps"] = {
        str(c): [prompt(short) for _ in range(c)] for c in step_concurrency
    }
    return out


# ---------------------------------------------------------------------------
# A: KerasHub generate() with static batches. Runs in-process with a model.
# ---------------------------------------------------------------------------


def _keras_generate(causal_lm, batch, max_tokens):
    """One static batch through `generate()`: ids in, new ids + text out."""
    import numpy as np

    length = len(batch[0])
    assert all(len(p) == length for p in batch)
    token_ids = np.zeros((len(batch), length + max_tokens), "int32")
    token_ids[:, :length] = np.asarray(batch, "int32")
    mask = np.zeros(token_ids.shape, bool)
    mask[:, :length] = True
    preprocessor = causal_lm.preprocessor
    causal_lm.preprocessor = None  # token ids in, token ids out
    try:
        out = causal_lm.generate(
            {"token_ids": token_ids, "padding_mask": mask},
            stop_token_ids=None,
        )
    finally:
        causal_lm.preprocessor = preprocessor
    new = np.asarray(out["token_ids"])[:, length:]
    # Detokenize like an engine returning text does.
    preprocessor.tokenizer.detokenize(new)
    return new.tolist()


def measure_keras(causal_lm, prompts, max_tokens=MAX_TOKENS):
    """System A on every cell: static batches of `concurrency` prompts.

    The model must be compiled with the greedy sampler. Each cell's warm-up
    batch compiles `generate()` for its shape; only the timed batches count.

    Returns:
        A worker result: `{"cells": [...], "steps": {...}}`.
    """
    cells = []
    for cell in prompts["cells"]:
        _keras_generate(causal_lm, cell["warmup"], max_tokens)
        cells.append(_timed_cell(
            cell, lambda b: _keras_generate(causal_lm, b, max_tokens)))
    steps = _step_times(
        prompts["steps"],
        lambda batch, tokens: _keras_generate(causal_lm, batch, tokens),
        warm=True,
    )
    return {"cells": cells, "steps": steps}


def _timed_cell(cell, run_batch):
    """Times each timed batch of a cell; `run_batch(prompts) -> new ids`."""
    reps, ids = [], []
    for batch in cell["timed"]:
        start = time.perf_counter()
        out = run_batch(batch)
        seconds = time.perf_counter() - start
        tokens = sum(len(o) for o in out)
        reps.append({"seconds": seconds, "tokens": tokens})
        ids.extend(out)
    seconds = sum(r["seconds"] for r in reps)
    tokens = sum(r["tokens"] for r in reps)
    return {
        "prompt_len": cell["prompt_len"],
        "concurrency": cell["concurrency"],
        "seconds": seconds,
        "tokens": tokens,
        "tok_s": tokens / seconds if seconds > 0 else None,
        "reps": reps,
        "ids": ids,
    }


def _step_times(step_prompts, run, warm):
    """Seconds per decode step: (t(1 + K new tokens) - t(1 new token)) / K.

    Both calls run the same prefill, so the difference is K decode steps
    (scheduling, input preparation, the model, sampling, detokenizing).
    For A one step is one iteration of `generate()`'s jitted loop. With
    `warm`, each shape runs once untimed first (A compiles per shape).
    """
    result = {}
    for c, batch in step_prompts.items():
        if warm:
            run(batch, 1)
            run(batch, 1 + STEP_TOKENS)
        start = time.perf_counter()
        run(batch, 1)
        one = time.perf_counter() - start
        start = time.perf_counter()
        run(batch, 1 + STEP_TOKENS)
        many = time.perf_counter() - start
        result[c] = {
            "first_token_s": one,
            "step_ms": 1000.0 * (many - one) / STEP_TOKENS,
        }
    return result


# ---------------------------------------------------------------------------
# Preparation: the model in every format (runs in the "prepare" worker).
# ---------------------------------------------------------------------------


def dir_bytes(path):
    """Total size of the files under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def fix_transformers_export(directory):
    """Makes keras-hub 0.32's `export_to_transformers` output load in vLLM.

    Two fixes (verified on keras-hub 0.32.0 / vLLM 0.32.0): `config.json`
    gets `architectures` (without it vLLM resolves `Qwen2Model`, which
    tpu-inference does not implement) and `torch_dtype`; a `lm_head.weight`
    stored beside tied embeddings is dropped (vLLM then unties the
    embeddings, and tpu-inference's untied Qwen2 path fails on text-only
    configs). The dropped tensor is checked to equal the embeddings.

    Returns:
        A list of strings describing what was changed.
    """
    import numpy as np
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    changes = []
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if not config.get("architectures"):
        names = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
        config["architectures"] = [names[config["model_type"]]]
        changes.append(f"architectures={config['architectures']}")
    config.setdefault("torch_dtype", "float32")
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    weights_path = os.path.join(directory, "model.safetensors")
    tensors = load_file(weights_path)
    if config.get("tie_word_embeddings") and "lm_head.weight" in tensors:
        head = tensors.pop("lm_head.weight")
        embed = tensors["model.embed_tokens.weight"]
        if not np.array_equal(head, embed):
            raise ValueError("lm_head.weight differs from the embeddings")
        save_file(tensors, weights_path, metadata={"format": "pt"})
        changes.append("dropped tied lm_head.weight")
    return changes


def _perturb(causal_lm, seed=0):
    """Scales the random init so greedy output is not one repeated token.

    A freshly initialised tiny model with tied embeddings decodes one token
    over and over, which would make the output-agreement check vacuous.
    Embeddings x8 and kernels x3 give prompt-dependent, varied greedy output
    at the same cost.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    for variable in causal_lm.backbone.weights:
        path = variable.path
        value = np.asarray(variable.value)
        if "embeddings" in path:
            value = value * 8.0
        elif path.endswith("kernel"):
            value = value * 3.0
        elif path.endswith("bias"):
            value = rng.normal(0.0, 0.1, value.shape)
        elif path.endswith("scale"):
            value = 1.0 + rng.normal(0.0, 0.1, value.shape)
        variable.assign(value.astype(variable.dtype))


def prepare(workdir, max_model_len, lora_steps=3):
    """Builds the model and writes it in every format; returns timings."""
    import keras_hub
    import numpy as np

    import keras_vllm
    from keras_vllm import testing
    from keras_vllm.testing.tokenizers import BPE_SPECIAL_TOKENS

    overrides = {k: v for k, v in MODEL.items() if k != "family"}
    causal_lm = testing.build_tiny_causal_lm(MODEL["family"], **overrides)
    _perturb(causal_lm)
    tokenizer = causal_lm.preprocessor.tokenizer
    special = [
        int(tokenizer.token_to_id(token))
        for token in BPE_SPECIAL_TOKENS[MODEL["family"]]
    ]
    result = {
        "model": dict(
            MODEL,
            parameters=int(causal_lm.backbone.count_params()),
            vocabulary_size=int(tokenizer.vocabulary_size()),
            first_special_id=min(special),
            dtype="float32",
        )
    }
    # A short greedy run, to record how varied the output is.
    sample = np.arange(32, dtype="int32")[None, :] + 7
    ids = _keras_generate(causal_lm, sample.tolist(), 32)[0]
    result["model"]["sample_distinct_tokens"] = len(set(ids))

    paths = {
        "preset": os.path.join(workdir, "preset"),
        "ours": os.path.join(workdir, "artifact"),
        "transformers": os.path.join(workdir, "transformers"),
        "lora": os.path.join(workdir, "artifact_lora"),
    }
    exports = {}

    start = time.perf_counter()
    causal_lm.save_to_preset(paths["preset"])
    exports["save_to_preset"] = {
        "seconds": time.perf_counter() - start,
        "bytes": dir_bytes(paths["preset"]),
    }
    start = time.perf_counter()
    keras_vllm.export_vllm(
        causal_lm,
        paths["ours"],
        weights="full",
        max_sequence_length=max_model_len,
        overwrite=True,
    )
    exports["export_vllm"] = {
        "seconds": time.perf_counter() - start,
        "bytes": dir_bytes(paths["ours"]),
        "note": "weights='full'; includes golden greedy outputs and "
        "checksums",
    }
    # The same export without golden outputs (generate() runs per prompt).
    no_golden = os.path.join(workdir, "artifact_no_golden")
    start = time.perf_counter()
    keras_vllm.export_vllm(
        causal_lm,
        no_golden,
        weights="full",
        max_sequence_length=max_model_len,
        overwrite=True,
        golden_prompts=(),
    )
    exports["export_vllm_no_golden"] = {
        "seconds": time.perf_counter() - start,
        "bytes": dir_bytes(no_golden),
    }
    start = time.perf_counter()
    causal_lm.export_to_transformers(paths["transformers"])
    seconds = time.perf_counter() - start
    exports["export_to_transformers"] = {
        "seconds": seconds,
        "bytes": dir_bytes(paths["transformers"]),
    }
    exports["export_to_transformers"]["fixes"] = fix_transformers_export(
        paths["transformers"]
    )
    exports["export_to_transformers"]["bytes_after_fixes"] = dir_bytes(
        paths["transformers"]
    )

    # LoRA: fine-tune the preset briefly, export the delta against it.
    tuned = keras_hub.models.CausalLM.from_preset(paths["preset"])
    tuned.compile(sampler="greedy")
    tuned.backbone.enable_lora(rank=8)
    testing.fine_tune(tuned, steps=lora_steps)
    start = time.perf_counter()
    keras_vllm.export_vllm(
        tuned, paths["lora"], max_sequence_length=max_model_len,
        overwrite=True,
    )
    seconds = time.perf_counter() - start
    manifest = json.load(
        open(os.path.join(paths["lora"], "manifest.json"))
    )
    result["lora"] = {
        "rank": 8,
        "steps": lora_steps,
        "export_seconds": seconds,
        "delta_bytes": dir_bytes(paths["lora"]),
        "full_bytes": exports["export_vllm"]["bytes"],
        "weights_mode": manifest["weights"]["mode"],
    }
    result["exports"] = exports
    result["paths"] = paths
    return result


# ---------------------------------------------------------------------------
# Engine workers (B, C-seed, C).
# ---------------------------------------------------------------------------


def _engine(system, spec):
    kwargs = dict(ENGINE_ARGS)
    kwargs["max_model_len"] = spec["max_model_len"]
    kwargs["max_num_seqs"] = spec["max_num_seqs"]
    if spec["engine_mode"] == "inproc" or system == "C-seed":
        kwargs["async_scheduling"] = False
    paths = spec["paths"]
    if system == "B":
        import vllm

        return vllm.LLM(model=paths["transformers"], **kwargs)
    if system == "C-seed":
        from keras_hub.vllm import KerasHubLLM

        return KerasHubLLM("keras_hub:" + paths["preset"], **kwargs)
    if system == "C":
        from keras_vllm import KerasVllmEngine

        return KerasVllmEngine.from_export(paths["ours"], **kwargs).llm
    raise ValueError(system)


def measure_engine(system, spec, prompts, t_spawn):
    """Starts one engine, then times its first token and every cell."""
    from vllm import SamplingParams

    def params(tokens):
        return SamplingParams(
            temperature=0.0, max_tokens=tokens, ignore_eos=True
        )

    def run(batch, tokens=spec["max_tokens"]):
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in batch],
            params(tokens),
            use_tqdm=False,
        )
        return [list(o.outputs[0].token_ids) for o in outputs]

    t_import = time.time()
    llm = _engine(system, spec)
    t_ready = time.time()
    run([prompts["ttft"]], 1)
    t_first = time.time()
    startup = {
        "engine_start_s": t_ready - t_import,
        "process_start_to_first_token_s": t_first - t_spawn,
        "first_request_s": t_first - t_ready,
    }
    cells = []
    for cell in prompts["cells"]:
        run(cell["warmup"])
        cells.append(_timed_cell(cell, run))
    steps = _step_times(prompts["steps"], run, warm=False)
    return {"cells": cells, "steps": steps, "startup": startup}


def _worker(args):
    t_spawn = float(os.environ.get("KERAS_VLLM_BENCH_SPAWN", time.time()))
    # Before anything imports keras (keras_hub does).
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("KERAS_NNX_ENABLED", "true")
    with open(args.spec) as f:
        spec = json.load(f)
    if args.worker == "prepare":
        result = prepare(spec["workdir"], spec["max_model_len"])
    else:
        with open(spec["prompts_file"]) as f:
            prompts = json.load(f)
        if args.worker == "A":
            import keras_hub

            import keras_vllm  # noqa: F401  (environment)

            start = time.time()
            causal_lm = keras_hub.models.CausalLM.from_preset(
                spec["paths"]["preset"], dtype="float32"
            )
            causal_lm.compile(sampler="greedy")
            loaded = time.time()
            # First token: `generate()` compiles for the shape on this call.
            _keras_generate(causal_lm, [prompts["ttft"]], 1)
            startup = {
                "load_s": loaded - start,
                "process_start_to_first_token_s": time.time() - t_spawn,
                "first_request_s": time.time() - loaded,
            }
            result = measure_keras(causal_lm, prompts, spec["max_tokens"])
            result["startup"] = startup
        else:
            result = measure_engine(args.worker, spec, prompts, t_spawn)
    result["versions"] = _versions()
    tmp = args.result + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.result)
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


# ---------------------------------------------------------------------------
# The parent: runs the workers one at a time and collects their JSON.
# ---------------------------------------------------------------------------


def _run_worker(name, spec_path, workdir, env_extra, timeout):
    result_path = os.path.join(workdir, f"result_{name}.json")
    log_path = os.path.join(workdir, f"log_{name}.txt")
    if os.path.exists(result_path):
        os.remove(result_path)
    env = dict(os.environ)
    env.update(env_extra)
    env["KERAS_VLLM_BENCH_SPAWN"] = repr(time.time())
    command = [sys.executable, os.path.abspath(__file__), "--worker", name,
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


def assemble(config, systems, prepare_result=None, environment=None):
    """The result document: config, per-system results, the table."""
    table = []
    for cell in config["cells"]:
        key = (cell["prompt_len"], cell["concurrency"])
        row = {"prompt_len": key[0], "concurrency": key[1]}
        reference = None
        for name in SYSTEMS:
            found = _cell(systems.get(name), key)
            row[name] = found["tok_s"] if found else None
            if name == "A" and found:
                reference = found["ids"]
            if name != "A" and found and reference is not None:
                row[f"{name} match A"] = [
                    sum(a == b for a, b in zip(reference, found["ids"])),
                    len(found["ids"]),
                ]
        for label, num, den in RATIOS:
            row[label] = (row[num] / row[den]
                          if row[num] and row[den] else None)
        table.append(row)
    doc = {
        "schema": SCHEMA,
        "config": config,
        "environment": environment or {},
        "systems": systems,
        "table": table,
    }
    if prepare_result is not None:
        doc["model"] = prepare_result.get("model")
        doc["exports"] = prepare_result.get("exports")
        doc["lora"] = prepare_result.get("lora")
    return doc


def _cell(system, key):
    if not system or not system.get("ok", True):
        return None
    for cell in system.get("cells", []):
        if (cell["prompt_len"], cell["concurrency"]) == key:
            return cell
    return None


def check_results(doc):
    """Raises ValueError unless `doc` has the result schema's shape."""
    def need(mapping, keys, where):
        for key in keys:
            if key not in mapping:
                raise ValueError(f"{where}: missing {key!r}")

    need(doc, ("schema", "config", "environment", "systems", "table"),
         "result")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"schema {doc['schema']!r} != {SCHEMA!r}")
    need(doc["config"], ("cells", "max_tokens", "engine_mode", "model"),
         "config")
    for name, system in doc["systems"].items():
        if name not in SYSTEMS:
            raise ValueError(f"unknown system {name!r}")
        if not system.get("ok", True):
            continue
        need(system, ("cells", "steps"), name)
        for cell in system["cells"]:
            need(cell, ("prompt_len", "concurrency", "seconds", "tokens",
                        "tok_s", "reps", "ids"), f"{name} cell")
    if len(doc["table"]) != len(doc["config"]["cells"]):
        raise ValueError("table rows != cells")
    for row in doc["table"]:
        need(row, ("prompt_len", "concurrency") + SYSTEMS
             + tuple(r[0] for r in RATIOS), "table row")
    return True


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def format_report(doc):
    """Markdown tables of a result document."""
    lines = ["output tokens/s (higher is better)", ""]
    header = ["prompt", "conc"] + list(SYSTEMS) + [r[0] for r in RATIOS]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for row in doc["table"]:
        cells = [str(row["prompt_len"]), str(row["concurrency"])]
        cells += [_fmt(row[s], ".0f") for s in SYSTEMS]
        cells += [_fmt(row[r[0]], ".2f") for r in RATIOS]
        lines.append("| " + " | ".join(cells) + " |")
    agreement = []
    for name in SYSTEMS[1:]:
        pairs = [row.get(f"{name} match A") for row in doc["table"]]
        pairs = [p for p in pairs if p]
        if pairs:
            agreement.append(f"{name} {sum(p[0] for p in pairs)}/"
                             f"{sum(p[1] for p in pairs)}")
    if agreement:
        lines += ["", "greedy outputs identical to A (requests): "
                  + ", ".join(agreement)]
    systems = doc["systems"]
    lines += ["", "| system | start -> first token (s) "
              "| engine start / load (s) "
              "| decode step c=1 (ms) | decode step c=max (ms) |",
              "|---|---|---|---|---|"]
    for name in SYSTEMS:
        system = systems.get(name)
        if not system or not system.get("ok", True):
            status = "-" if not system else "failed: " + system["error"]
            lines.append(f"| {name} | {status} | | | |")
            continue
        startup = system.get("startup", {})
        steps = system.get("steps", {})
        keys = sorted(steps, key=int)
        first = steps[keys[0]]["step_ms"] if keys else None
        last = steps[keys[-1]]["step_ms"] if len(keys) > 1 else None
        first_token = startup.get("process_start_to_first_token_s")
        start = startup.get("engine_start_s", startup.get("load_s"))
        lines.append(
            f"| {name} | {_fmt(first_token, '.1f')} | {_fmt(start, '.1f')} "
            f"| {_fmt(first, '.1f')} | {_fmt(last, '.1f')} |"
        )
    exports = doc.get("exports")
    if exports:
        lines += ["", "| export | seconds | MB |", "|---|---|---|"]
        for name, item in exports.items():
            lines.append(f"| {name} | {item['seconds']:.2f} | "
                         f"{item['bytes'] / 1e6:.2f} |")
    lora = doc.get("lora")
    if lora:
        lines += ["", f"LoRA (rank {lora['rank']}, {lora['steps']} steps) "
                  f"artifact: {lora['delta_bytes'] / 1e6:.2f} MB "
                  f"(weights={lora['weights_mode']}) vs full "
                  f"{lora['full_bytes'] / 1e6:.2f} MB"]
    return "\n".join(lines)


def _environment():
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"cells {QUICK_PROMPT_LENGTHS} x "
                        f"{QUICK_CONCURRENCIES} instead of "
                        f"{PROMPT_LENGTHS} x {CONCURRENCIES}")
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
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--reps", type=int, default=1,
                        help="timed batches per cell")
    parser.add_argument("--engine-mode", choices=("inproc", "default"),
                        default="inproc")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)

    lengths = PROMPT_LENGTHS
    concs = CONCURRENCIES
    if args.quick:
        lengths, concs = QUICK_PROMPT_LENGTHS, QUICK_CONCURRENCIES
    if args.prompt_lengths:
        lengths = [int(x) for x in args.prompt_lengths.split(",")]
    if args.concurrencies:
        concs = [int(x) for x in args.concurrencies.split(",")]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}")
    cells = make_cells(lengths, concs)
    max_model_len = max(lengths) + args.max_tokens
    workdir = args.workdir or tempfile.mkdtemp(prefix="keras_vllm_bench_")
    os.makedirs(workdir, exist_ok=True)
    workdir = os.path.abspath(workdir)
    config = {
        "cells": cells,
        "max_tokens": args.max_tokens,
        "reps": args.reps,
        "engine_mode": args.engine_mode,
        "engine_args": dict(ENGINE_ARGS, max_model_len=max_model_len,
                            max_num_seqs=max(concs)),
        "cpu_memory_gb": CPU_MEMORY_GB,
        "model": MODEL,
        "command": " ".join([os.path.basename(sys.argv[0])]
                            + (argv if argv is not None else sys.argv[1:])),
    }
    env = {
        "KERAS_VLLM_CPU_MEMORY_GB": CPU_MEMORY_GB,
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
    }
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    t0 = time.time()
    prepared = _run_worker("prepare", spec_path, workdir, env,
                           WORKER_TIMEOUT_S)
    if not prepared.get("ok"):
        return 1
    for key, value in prepared["exports"].items():
        print(f"[bench] export {key}: {value['seconds']:.2f} s, "
              f"{value['bytes']} bytes", flush=True)
    prompts = make_prompts(cells, prepared["model"]["first_special_id"],
                           reps=args.reps)
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
        results[name] = _run_worker(name, spec_path, workdir, worker_env,
                                    WORKER_TIMEOUT_S)
        # Keep partial results on disk as the run goes.
        doc = assemble(config, results, prepared, _environment())
        _write(args.out, doc)
    doc = assemble(config, results, prepared, _environment())
    doc["environment"]["versions"] = next(
        (r["versions"] for r in results.values() if r.get("versions")), {})
    doc["environment"]["total_wall_s"] = time.time() - t0
    doc["environment"]["workdir"] = workdir
    check_results(doc)
    _write(args.out, doc)
    print()
    print(format_report(doc))
    print(f"\n[bench] wrote {args.out} ({time.time() - t0:.0f} s)")
    return 0 if all(r.get("ok") for r in results.values()) else 1


def _write(path, doc):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
