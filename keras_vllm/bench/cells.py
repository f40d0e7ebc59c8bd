"""The benchmark's cells and prompts (pure Python, no model)."""

import random

PROMPT_LENGTHS = (32, 512)
CONCURRENCIES = (1, 16, 32, 64)
QUICK_PROMPT_LENGTHS = (32, 512)
QUICK_CONCURRENCIES = (1, 16)
MAX_TOKENS = 32


def make_cells(prompt_lengths, concurrencies):
    """Returns the (prompt length, concurrency) cells, in table order."""
    return [
        {"prompt_len": int(n), "concurrency": int(c)}
        for n in prompt_lengths
        for c in concurrencies
    ]


def make_prompts(cells, vocab_size, *, reps=1, seed=0, step_concurrency=None,
                 first_id=0):
    """Distinct random prompts (token id lists) for every cell and system.

    Each cell gets one warm-up batch and `reps` timed batches of
    `concurrency` prompts; the step measurement gets its own prompts. No two
    prompts share their first token pair *and* anything else: all prompts
    are distinct, so vLLM's prefix cache never hits.

    Args:
        cells: from `make_cells`.
        vocab_size: ids are drawn from `[first_id, vocab_size)`: a range
            holding no special token id.
        reps: timed batches per cell.
        seed: the random seed.
        step_concurrency: batch sizes of the per-step measurement (default:
            1 and the largest concurrency).
        first_id: the range's first id.

    Returns:
        `{"cells": [{"prompt_len", "concurrency", "warmup": [...],
        "timed": [[...], ...]}], "ttft": ids, "steps": {c: [...]}}`.
    """
    rng = random.Random(seed)
    seen = set()

    def prompt(length):
        while True:
            ids = tuple(
                rng.randrange(first_id, vocab_size) for _ in range(length)
            )
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

