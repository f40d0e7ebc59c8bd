"""Measurement: one system's output tokens/s per cell and time per decode
step, for A (KerasHub `generate()`, in-process with a model) and for the
engines B, C-seed and C (each started here; vLLM is imported lazily)."""

import time

from keras_vllm.bench import mixed
from keras_vllm.bench import models
from keras_vllm.bench.cells import MAX_TOKENS

# Decode steps timed for the per-step measurement (see `step_times`).
STEP_TOKENS = 32

# vLLM engine arguments shared by B, C-seed and C (`max_model_len`,
# `max_num_seqs` are set per run from the cells, `dtype` from the model).
ENGINE_ARGS = {
    "dtype": "float32",
    "max_num_batched_tokens": 2048,
    "gpu_memory_utilization": 0.5,
    "seed": 0,
}


def keras_generate(causal_lm, batch, max_tokens):
    """One static batch through `generate()`: ids in, new ids + text out."""
    import numpy as np

    length = len(batch[0])
    assert all(len(p) == length for p in batch)
    token_ids = np.zeros((len(batch), length + max_tokens), "int32")
    token_ids[:, :length] = np.asarray(batch, "int32")
    mask = np.zeros(token_ids.shape, bool)
    mask[:, :length] = True
    new = mixed.generate_token_ids(causal_lm, token_ids, mask)[:, length:]
    # Detokenize like an engine returning text does.
    causal_lm.preprocessor.tokenizer.detokenize(new)
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
        keras_generate(causal_lm, cell["warmup"], max_tokens)
        cells.append(timed_cell(
            cell, lambda b: keras_generate(causal_lm, b, max_tokens)))
    steps = step_times(
        prompts["steps"],
        lambda batch, tokens: keras_generate(causal_lm, batch, tokens),
        warm=True,
    )
    result = {"cells": cells, "steps": steps}
    if prompts.get("mixed"):
        result["mixed"] = mixed.measure_keras_mixed(
            causal_lm, prompts["mixed"]["workload"],
            prompts["mixed"]["batch_size"],
        )
    return result


def timed_cell(cell, run_batch):
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


def step_times(step_prompts, run, warm):
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


def _engine(system, spec):
    kwargs = dict(ENGINE_ARGS)
    kwargs["max_model_len"] = spec["max_model_len"]
    kwargs["max_num_seqs"] = spec["max_num_seqs"]
    # The model's own dtype (specs written before models had one: float32).
    kwargs["dtype"] = models.dtype(spec.get("model", "tiny"))
    if spec["engine_mode"] == "inproc" or system == "C-seed":
        kwargs["async_scheduling"] = False
    paths = spec["paths"]
    if system == "B":
        import vllm

        from keras_vllm.bench import torchax_fixes

        torchax_fixes.answer_promote_types()
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
        cells.append(timed_cell(cell, run))
    steps = step_times(prompts["steps"], run, warm=False)
    result = {"cells": cells, "steps": steps, "startup": startup}
    if prompts.get("mixed"):
        result["mixed"] = mixed.measure_engine_mixed(
            llm, prompts["mixed"]["warmup"], prompts["mixed"]["workload"]
        )
    return result

