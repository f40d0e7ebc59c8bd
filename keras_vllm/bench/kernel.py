"""Per-layer times of the pure-JAX ragged paged attention (a report).

The CPU backend runs every attention layer through
`keras_vllm.kernels.ragged_paged_attention`. Its two speed knobs change
how the work is blocked, never what a query computes: `q_block` (queries
per inner step of a multi-query sequence) and `single_query_block` (rows
per inner step of a one-query sequence, a decode).
This times one layer's call, jitted with the cache donated as the engines
do, for each setting on the shapes a serving step has, checks that the
settings agree, and prints a table (best of `--reps`, ms):

    python -m keras_vllm.bench.kernel [--reps 5] [--layout tiny|medium]

`--layout tiny` is the benchmark's tiny model (4 query / 2 KV heads,
head_dim 64), `medium` the ~128M one (12 / 4, head_dim 64); both use the
hd64 cache layout and 64-token pages, as tpu-inference allocates them on
CPU.
"""

import argparse
import os
import time

import numpy as np

# (name, [(q_len, kv_len), ...]) of one serving step.
STEPS = (
    ("prefill 4 x 512", [(512, 512)] * 4),
    ("mixed: 31 decodes + 1 x 512 prefill", [(1, 64)] * 31 + [(512, 512)]),
    ("decode 64 seqs, context 544", [(1, 544)] * 64),
    ("decode 32 seqs, context 64", [(1, 64)] * 32),
    ("decode 16 seqs, context 64", [(1, 64)] * 16),
    ("decode 1 seq, context 64 (16-token bucket)", [(1, 64)]),
    ("decode 1 seq, context 64 (1-token bucket)", [(1, 64)]),
)
# Token bucket per step (tpu-inference pads the step's tokens to one).
BUCKETS = {"decode 1 seq, context 64 (1-token bucket)": 1}
SETTINGS = (
    ("8 rows for every sequence (before)", dict(q_block=8,
                                                single_query_block=8)),
    ("32 rows for every sequence", dict(q_block=32, single_query_block=32)),
    ("32 rows, decodes 1 row (now)", dict(q_block=32,
                                          single_query_block=1)),
)
LAYOUTS = {"tiny": (4, 2), "medium": (12, 4)}
HEAD_DIM = 64
PAGE_SIZE = 64
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 1024


def _step_inputs(seqs, num_q_heads, num_kv_heads, bucket=None):
    import jax.numpy as jnp
    from tpu_inference.kernels.ragged_paged_attention.v3 import kernel_hd64

    rng = np.random.default_rng(0)
    pages_per_seq = MAX_MODEL_LEN // PAGE_SIZE
    num_pages = MAX_NUM_SEQS * pages_per_seq
    total = sum(q for q, _ in seqs)
    num_tokens = bucket or max(16, 1 << (total - 1).bit_length())
    shape = kernel_hd64.get_kv_cache_shape(num_pages, PAGE_SIZE,
                                           num_kv_heads, HEAD_DIM,
                                           jnp.float32)
    kv_lens = np.zeros(MAX_NUM_SEQS, np.int32)
    kv_lens[:len(seqs)] = [kv for _, kv in seqs]
    cu_q_lens = np.full(MAX_NUM_SEQS + 1, total, np.int32)
    cu_q_lens[:len(seqs) + 1] = np.concatenate(
        [[0], np.cumsum([q for q, _ in seqs])])
    num_decode = sum(1 for q, _ in seqs if q == 1)
    tokens = lambda heads: rng.standard_normal(  # noqa: E731
        (num_tokens, heads, HEAD_DIM)).astype(np.float32)
    return dict(
        queries=jnp.asarray(tokens(num_q_heads)),
        keys=jnp.asarray(tokens(num_kv_heads)),
        values=jnp.asarray(tokens(num_kv_heads)),
        kv_cache=jnp.asarray(rng.standard_normal(shape).astype(np.float32)),
        kv_lens=jnp.asarray(kv_lens),
        page_indices=jnp.asarray(
            rng.permutation(num_pages).astype(np.int32)),
        cu_q_lens=jnp.asarray(cu_q_lens),
        distribution=jnp.asarray([num_decode, len(seqs), len(seqs)],
                                 np.int32),
    ), total


def time_setting(inputs, setting, reps):
    """(best ms of `reps` calls, output) of one kernel setting."""
    import jax

    from keras_vllm import kernels

    def call(kv_cache, **rest):
        return kernels.ragged_paged_attention(
            kv_cache=kv_cache, hd64=True, sm_scale=HEAD_DIM**-0.5, **rest,
            **setting)

    fn = jax.jit(call, donate_argnames=("kv_cache",))
    rest = {k: v for k, v in inputs.items() if k != "kv_cache"}
    cache = inputs["kv_cache"].copy()
    out, cache = fn(cache, **rest)  # compile
    out.block_until_ready()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        out, cache = fn(cache, **rest)
        out.block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best * 1e3, np.asarray(out)


def measure(layout="tiny", reps=5, steps=STEPS):
    """Rows `{"step", "tokens", <setting>: ms, ...}`; checks agreement."""
    num_q_heads, num_kv_heads = LAYOUTS[layout]
    rows = []
    for name, seqs in steps:
        inputs, total = _step_inputs(seqs, num_q_heads, num_kv_heads,
                                     BUCKETS.get(name))
        row = {"step": name, "tokens": int(inputs["queries"].shape[0])}
        outputs = []
        for label, setting in SETTINGS:
            row[label], out = time_setting(inputs, setting, reps)
            outputs.append(out[:total])
        for out in outputs[1:]:
            # Blocking changes summation order at most by rounding.
            np.testing.assert_allclose(out, outputs[0], rtol=1e-5,
                                       atol=1e-5)
        rows.append(row)
    return rows


def table(rows):
    labels = [label for label, _ in SETTINGS]
    lines = ["| step | tokens | " + " | ".join(labels) + " |",
             "|---|---|" + "---|" * len(labels)]
    for row in rows:
        cells = " | ".join(f"{row[label]:.2f}" for label in labels)
        lines.append(f"| {row['step']} | {row['tokens']} | {cells} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="tiny")
    args = parser.parse_args()
    # A kernel on its own: no engine, so nothing else picks the platform.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    print(f"ms per layer call, best of {args.reps}; layout {args.layout} "
          f"{LAYOUTS[args.layout]} heads, head_dim {HEAD_DIM}, page "
          f"{PAGE_SIZE}")
    print(table(measure(args.layout, args.reps)))


if __name__ == "__main__":
    main()
