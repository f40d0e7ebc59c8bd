"""The mixed workload: requests that differ in prompt and output length.

What a server sees, unlike the benchmark's cells (every prompt of a batch
one length, every request the same number of new tokens): `n` requests
whose prompt and output lengths come from a fixed long-tailed (log-normal)
distribution, seeded, all submitted at once. An engine schedules them
continuously; A (KerasHub `generate()`) runs them as static batches of
`batch_size` in arrival order, each batch padded to its longest prompt plus
its longest output (rounded up to 16, so few shapes compile), every row
decoding to the batch's end. Output tokens/s counts the tokens requested,
the same for every system.

Example (a row of the table `python -m keras_vllm.bench --mixed 256` adds):

```python
workload = mixed_workload(256, vocab_size=1000, max_prompt=512,
                          max_output=128)
result = measure_keras_mixed(causal_lm, workload, batch_size=64)
result["tok_s"]
```
"""

import math
import random
import time

# The shapes A compiles: batch widths are rounded up to a multiple of this.
WIDTH_MULTIPLE = 16


def mixed_workload(n, vocab_size, max_prompt, max_output, seed=0,
                   first_id=0):
    """`n` requests with long-tailed prompt and output lengths.

    Prompt lengths are log-normal with median `max_prompt / 8`, clipped to
    `[4, max_prompt]`; output lengths log-normal with median `max_output /
    4`, clipped to `[1, max_output]` (sigma 1: most requests short, a few
    at the limits). Every prompt is distinct (no prefix-cache hits).

    Args:
        n: int. Number of requests.
        vocab_size: int. Ids are drawn from `[first_id, vocab_size)`.
        max_prompt: int. The longest prompt.
        max_output: int. The most new tokens a request asks for.
        seed: int. The random seed: equal arguments give equal workloads.
        first_id: int. The first id prompts may hold.

    Returns:
        A list of `{"prompt": [ids], "max_tokens": int}`, in arrival order.
    """
    rng = random.Random(seed)
    seen = set()
    requests = []

    def length(median, low, high):
        value = rng.lognormvariate(math.log(max(median, 1.0)), 1.0)
        return int(min(high, max(low, round(value))))

    while len(requests) < n:
        prompt = tuple(
            rng.randrange(first_id, vocab_size)
            for _ in range(length(max_prompt / 8, 4, max_prompt))
        )
        if prompt in seen:
            continue
        seen.add(prompt)
        requests.append({
            "prompt": list(prompt),
            "max_tokens": length(max_output / 4, 1, max_output),
        })
    return requests


def padded_batches(workload, batch_size):
    """A's static batches: `batch_size` requests in arrival order."""
    return [
        workload[i:i + batch_size]
        for i in range(0, len(workload), batch_size)
    ]


def keras_batch(causal_lm, batch):
    """One padded static batch through `generate()`; each request's new ids
    (its own `max_tokens` of them)."""
    import numpy as np

    longest = max(len(r["prompt"]) for r in batch)
    width = longest + max(r["max_tokens"] for r in batch)
    width = -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    token_ids = np.zeros((len(batch), width), "int32")
    mask = np.zeros(token_ids.shape, bool)
    for row, request in enumerate(batch):
        token_ids[row, :len(request["prompt"])] = request["prompt"]
        mask[row, :len(request["prompt"])] = True
    out = generate_token_ids(causal_lm, token_ids, mask)
    new = [
        out[row, len(r["prompt"]):len(r["prompt"]) + r["max_tokens"]]
        for row, r in enumerate(batch)
    ]
    # Detokenize like an engine returning text does.
    for ids in new:
        causal_lm.preprocessor.tokenizer.detokenize(ids)
    return [ids.tolist() for ids in new]


def generate_token_ids(causal_lm, token_ids, mask):
    """`generate()`'s compiled function with token ids in and out; the filled
    `token_ids` as a NumPy array. A's one path, for the cells
    (`measure.keras_generate`) and this workload.

    What `generate()` runs for one batch of ids, without its pre- and
    post-processing: with no preprocessor, Gemma 3's `generate()` cannot
    join its outputs (they hold `None` for the image inputs).
    """
    import numpy as np

    generate = causal_lm.make_generate_function()
    out = generate(
        {"token_ids": token_ids, "padding_mask": mask}, stop_token_ids=None
    )
    return np.asarray(out["token_ids"])


def measure_keras_mixed(causal_lm, workload, batch_size):
    """System A on the mixed workload: one untimed pass (compiles each batch
    width), then the timed pass."""
    batches = padded_batches(workload, batch_size)
    for batch in batches:
        keras_batch(causal_lm, batch)
    start = time.perf_counter()
    ids = [ids for batch in batches for ids in keras_batch(causal_lm, batch)]
    return _result(workload, ids, time.perf_counter() - start)


def measure_engine_mixed(llm, warmup, workload):
    """An engine (a `vllm.LLM`) on the mixed workload: `warmup` (another
    workload of the same distribution: the timed prompts stay uncached)
    untimed, then `workload` submitted at once."""
    from vllm import SamplingParams

    def run(requests):
        outputs = llm.generate(
            [{"prompt_token_ids": r["prompt"]} for r in requests],
            [
                SamplingParams(
                    temperature=0.0, max_tokens=r["max_tokens"],
                    ignore_eos=True,
                )
                for r in requests
            ],
            use_tqdm=False,
        )
        return [list(o.outputs[0].token_ids) for o in outputs]

    run(warmup)
    start = time.perf_counter()
    ids = run(workload)
    return _result(workload, ids, time.perf_counter() - start)


def _result(workload, ids, seconds):
    tokens = sum(len(i) for i in ids)
    return {
        "requests": len(workload),
        "tokens": tokens,
        "requested_tokens": sum(r["max_tokens"] for r in workload),
        "seconds": seconds,
        "tok_s": tokens / seconds if seconds > 0 else None,
        "ids": ids,
    }


def table(systems):
    """Markdown rows of the mixed workload for each system that ran it,
    with its requests identical to A's and its rate over A's."""
    reference = (systems.get("A") or {}).get("mixed")
    lines = [
        "| system | requests | output tokens | seconds | tok/s "
        "| identical to A | / A |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, system in systems.items():
        mixed = (system or {}).get("mixed")
        if not mixed:
            continue
        same = ratio = "-"
        if reference and name != "A":
            same = (f"{sum(a == b for a, b in zip(reference['ids'], mixed['ids']))}"
                    f"/{mixed['requests']}")
            if reference["tok_s"] and mixed["tok_s"]:
                ratio = f"{mixed['tok_s'] / reference['tok_s']:.2f}"
        lines.append(
            f"| {name} | {mixed['requests']} | {mixed['tokens']} "
            f"| {mixed['seconds']:.2f} | {mixed['tok_s']:.0f} | {same} "
            f"| {ratio} |"
        )
    return lines if len(lines) > 2 else []
