"""Mixture of experts served dense (KerasHub's block) and routed (top-k).

```
python -m keras_vllm.bench.moe            # 8x2 and 32x4, ~20 min here
python -m keras_vllm.bench.moe --shapes 8x2 --new-tokens 8
python -m keras_vllm.bench.moe --family gpt_oss --shapes 8x2
```

For each shape `ExK` it builds a Mixtral-shaped model (or, with
`--family gpt_oss`, a GPT-OSS-shaped one: attention sinks with head_dim
64, top-k-then-softmax router, clamped SwiGLU experts with biases; random
weights: speed does not depend on their values) whose expert weights
dominate a step, and a Mistral-shaped dense model of the same active size
(same attention, intermediate = k experts' worth). It serves the MoE model twice,
with `KERAS_VLLM_MOE_EXPERTS=dense` (every expert for every token, as
KerasHub computes it) and `routed` (each token's top-k experts), and the
dense model once, one engine after another (vLLM's default multiprocess
mode), and prints per engine: the decode step at concurrency 1 and 32
(milliseconds per step, from the time of `1 + n` new tokens minus that of
1, divided by n; each the fastest of 3 runs after a first that compiles)
and prefill tokens/s (8 prompts of 128 tokens, one new token each); then routed/dense and MoE/same-active-size-dense ratios.
`--rounds 2` runs the engines twice in alternating order (the host is
shared: each cell reports its fastest round).
"""

import argparse
import os
import time

from keras_vllm import envs
from keras_vllm.bench import engine_rate

# Attention and width shared by every model here: head_dim 128 (8 query
# heads, 4 key/value heads), 2 layers, the tiny Llama tokenizer.
BASE = dict(num_layers=2, hidden_dim=1024, num_query_heads=8,
            num_key_value_heads=4)
# experts -> expert intermediate size: ~200 MB of float32 expert weights
# per layer in both shapes, against 12 MB of attention.
EXPERT_INTERMEDIATE = {8: 2048, 32: 512}
PROMPT_TOKENS = 16
PREFILL_PROMPTS, PREFILL_TOKENS = 8, 128
REPEATS = 3


# The MoE families this benchmark builds, and their head size (GPT-OSS's
# sinks need 64; its expert weights, `[E, H, 2I]` and `[E, I, H]`, are as
# many bytes as Mixtral's three `[E, H, I]` kernels).
HEAD_DIMS = {"mixtral": BASE["hidden_dim"] // BASE["num_query_heads"],
             "gpt_oss": 64}


def build(shape, family="mixtral"):
    """`(moe_model, dense_model)` for a shape `(experts, top_k)`."""
    from keras_vllm import testing

    experts, top_k = shape
    inner = EXPERT_INTERMEDIATE.get(experts, 8192 // experts)
    head_dim = HEAD_DIMS[family]
    extra = {} if family == "mixtral" else {"head_dim": head_dim}
    moe = testing.build_tiny_causal_lm(
        family, num_experts=experts, top_k=top_k,
        intermediate_dim=inner, sliding_window=512, **BASE, **extra,
    )
    dense = testing.build_tiny_causal_lm(
        "mistral", intermediate_dim=top_k * inner, sliding_window=512,
        head_dim=head_dim, **BASE,
    )
    return moe, dense


def _prompts(count, length, vocabulary, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        {"prompt_token_ids": rng.integers(10, vocabulary - 10, length).tolist()}
        for _ in range(count)
    ]


def _seconds(engine, prompts, max_tokens):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                            ignore_eos=True)
    start = time.perf_counter()
    engine.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def measure(path, vocabulary, new_tokens, mode, tensor_parallel_size=1):
    """Decode step (ms) at concurrency 1 and 32 and prefill tokens/s of
    one engine, with `KERAS_VLLM_MOE_EXPERTS=mode`."""
    import keras_vllm

    envs.MOE_EXPERTS.set(mode)  # read by the engine process it starts
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, verbose=False, max_num_seqs=32, enable_prefix_caching=False,
        tensor_parallel_size=tensor_parallel_size,
    )
    result = {}
    try:
        seed = 0
        for concurrency in (1, 32):
            times = {1: [], 1 + new_tokens: []}
            # Alternating, the first of each compiling what it needs; each
            # length's fastest run counts (the host is shared).
            for _ in range(REPEATS + 1):
                for tokens in times:
                    seed += 1
                    prompts = _prompts(concurrency, PROMPT_TOKENS,
                                       vocabulary, seed)
                    times[tokens].append(_seconds(engine, prompts, tokens))
            fastest = {tokens: min(runs[1:]) for tokens, runs in times.items()}
            step = (fastest[1 + new_tokens] - fastest[1]) / new_tokens
            result[f"decode_c{concurrency}_ms"] = 1e3 * step
        prefill = []
        for _ in range(REPEATS):
            seed += 1
            prompts = _prompts(PREFILL_PROMPTS, PREFILL_TOKENS, vocabulary,
                               seed)
            prefill.append(_seconds(engine, prompts, 1))
        result["prefill_tok_s"] = PREFILL_PROMPTS * PREFILL_TOKENS / min(
            prefill
        )
    finally:
        engine.shutdown()
        os.environ.pop(envs.MOE_EXPERTS.name, None)
    return result


def _best(runs):
    """Per cell, the fastest of the rounds."""
    best = dict(runs[0])
    for run in runs[1:]:
        for key, value in run.items():
            better = max if key.endswith("tok_s") else min
            best[key] = better(best[key], value)
    return best


def _row(name, stats):
    return [name, f"{stats['decode_c1_ms']:.1f}",
            f"{stats['decode_c32_ms']:.1f}", f"{stats['prefill_tok_s']:.0f}"]


def run_shape(shape, new_tokens, rounds, family="mixtral",
              tensor_parallel_size=1, dense_experts=True):
    moe, dense = build(shape, family)
    # Prompt ids both models' tokenizers know (GPT-OSS's BPE is larger
    # than the dense model's SentencePiece).
    vocabulary = min(
        moe.backbone.vocabulary_size, dense.backbone.vocabulary_size
    )
    sizes = {
        "moe": moe.backbone.count_params(),
        "dense": dense.backbone.count_params(),
    }
    paths = {
        "moe": engine_rate.export(moe, "moe"),
        "dense": engine_rate.export(dense, "dense"),
    }
    del moe, dense
    engines = [("MoE, dense experts", "moe", "dense"),
               ("MoE, routed experts", "moe", "routed"),
               ("dense, same active size", "dense", "routed")]
    if not dense_experts:
        engines = engines[1:]
    runs = {name: [] for name, _, _ in engines}
    for index in range(rounds):
        order = engines if index % 2 == 0 else engines[::-1]
        for name, model, mode in order:
            runs[name].append(
                measure(paths[model], vocabulary, new_tokens, mode,
                        tensor_parallel_size)
            )
    return sizes, {name: _best(r) for name, r in runs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x2,32x4",
                        help="experts x top-k, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--family", default="mixtral", choices=HEAD_DIMS,
                        help="the MoE model's family")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--no-dense-experts", action="store_true",
        help="skip the MoE engine that computes every expert (the slowest)",
    )
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    for text in args.shapes.split(","):
        experts, top_k = (int(n) for n in text.lower().split("x"))
        sizes, stats = run_shape(
            (experts, top_k), args.new_tokens, args.rounds, args.family,
            args.tensor_parallel_size, not args.no_dense_experts,
        )
        dense_moe = stats.get("MoE, dense experts")
        routed = stats["MoE, routed experts"]
        same = stats["dense, same active size"]
        print(f"\n{args.family}, {experts} experts, top-{top_k}: MoE "
              f"{sizes['moe']:,} "
              f"parameters, dense {sizes['dense']:,}; {args.new_tokens} new "
              f"tokens per decode timing, best of {args.rounds} round(s), "
              f"TP={args.tensor_parallel_size}; "
              f"load average {os.getloadavg()}")
        print("| engine | decode step c=1 (ms) | decode step c=32 (ms) | "
              "prefill (tok/s) |")
        print("|---|---|---|---|")
        for name, cells in stats.items():
            print("| " + " | ".join(_row(name, cells)) + " |")
        if dense_moe is not None:
            print(
                "routed/dense decode: c=1 "
                f"{routed['decode_c1_ms'] / dense_moe['decode_c1_ms']:.3f}, "
                "c=32 "
                f"{routed['decode_c32_ms'] / dense_moe['decode_c32_ms']:.3f}"
                "; prefill routed/dense "
                f"{routed['prefill_tok_s'] / dense_moe['prefill_tok_s']:.2f}x"
            )
        print(
            "MoE routed / same-active dense decode: c=1 "
            f"{routed['decode_c1_ms'] / same['decode_c1_ms']:.2f}, c=32 "
            f"{routed['decode_c32_ms'] / same['decode_c32_ms']:.2f}"
        )


if __name__ == "__main__":
    main()
