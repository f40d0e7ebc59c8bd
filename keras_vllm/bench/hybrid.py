"""Decode step of a hybrid linear-attention model (Qwen 3.5) against the
same-size full-attention model (Qwen3).

```
python -m keras_vllm.bench.hybrid                  # --model medium, ~10 min here
python -m keras_vllm.bench.hybrid --model tiny --new-tokens 8
```

Qwen 3.5 keeps, per sequence, a fixed-size recurrent state in three of
every four layers (a conv window and a delta-rule matrix per value head,
read and rewritten by every token) and a KV cache in the fourth; Qwen3
keeps a KV cache in every layer. Both models here have the same depth,
width, MLP, tied vocabulary and full-attention heads; Qwen 3.5's linear layers
have as many value heads of the same size as Qwen3's query heads and half
as many key heads (the presets' ratio), so their projections are about the
size of Qwen3's attention projections (the table prints both parameter
counts). Random weights: speed does not depend on their values.

Per engine (one after the other, vLLM's default multiprocess mode, prefix
caching off for both, `max_num_seqs=32`): the decode step at concurrency 1
and 32 (milliseconds per step, from the time of `1 + n` new tokens minus
that of 1, divided by n; each the fastest of 3 runs after one that
compiles, `keras_vllm.bench.moe.measure`) and prefill tokens/s (8 prompts
of 128 tokens, one new token each). `--rounds 2` alternates the engines'
order (the host is shared: each cell reports its fastest round).
"""

import argparse
import os

from keras_vllm.bench import engine_rate
from keras_vllm.bench import moe

# Full-attention shapes of `keras_vllm.bench.models` (Qwen2 there), with
# head_dim 64; `vocabulary_size` fills the BPE tokenizer up.
SIZES = {
    "tiny": dict(num_layers=4, hidden_dim=256, intermediate_dim=512,
                 num_query_heads=4, num_key_value_heads=2,
                 vocabulary_size=1024),
    "medium": dict(num_layers=12, hidden_dim=768, intermediate_dim=3072,
                   num_query_heads=12, num_key_value_heads=4,
                   vocabulary_size=32000),
}
HEAD_DIM = 64
FAMILIES = ("qwen3_5", "qwen3")


def build(size, family):
    """A random model of `family` (`qwen3_5` or `qwen3`) at `size`."""
    from keras_vllm import testing

    shape = dict(SIZES[size])
    vocabulary = shape.pop("vocabulary_size")
    extra = {}
    if family == "qwen3_5":
        heads = shape["num_query_heads"]
        extra = dict(
            linear_num_key_heads=heads // 2,
            linear_num_value_heads=heads,
            linear_key_head_dim=HEAD_DIM,
            linear_value_head_dim=HEAD_DIM,
        )
    # Tied embeddings in both (Qwen3's default; Qwen 3.5's small presets
    # tie theirs too), so the vocabulary counts once in each.
    return testing.build_tiny_causal_lm(
        family, head_dim=HEAD_DIM, filled_vocabulary=vocabulary,
        tie_word_embeddings=True, **shape, **extra,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="medium", choices=sorted(SIZES))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    sizes, paths = {}, {}
    for family in FAMILIES:
        model = build(args.model, family)
        sizes[family] = model.backbone.count_params()
        vocabulary = model.backbone.vocabulary_size
        paths[family] = engine_rate.export(model, family)
        del model
    runs = {family: [] for family in FAMILIES}
    for index in range(args.rounds):
        order = FAMILIES if index % 2 == 0 else FAMILIES[::-1]
        for family in order:
            runs[family].append(
                moe.measure(paths[family], vocabulary, args.new_tokens,
                            "routed")
            )
    stats = {family: moe._best(r) for family, r in runs.items()}
    print(f"\n--model {args.model}: Qwen 3.5 {sizes['qwen3_5']:,} "
          f"parameters, Qwen3 {sizes['qwen3']:,}; {args.new_tokens} new "
          f"tokens per decode timing, best of {args.rounds} round(s); "
          f"load average {os.getloadavg()}")
    print("| model | decode step c=1 (ms) | decode step c=32 (ms) | "
          "prefill (tok/s) |")
    print("|---|---|---|---|")
    names = {"qwen3_5": "Qwen 3.5 (3 GDN : 1 attention)",
             "qwen3": "Qwen3 (all attention)"}
    for family in FAMILIES:
        print("| " + " | ".join(moe._row(names[family], stats[family]))
              + " |")
    hybrid, full = stats["qwen3_5"], stats["qwen3"]
    print(
        "Qwen 3.5 / Qwen3 decode: c=1 "
        f"{hybrid['decode_c1_ms'] / full['decode_c1_ms']:.2f}, c=32 "
        f"{hybrid['decode_c32_ms'] / full['decode_c32_ms']:.2f}; prefill "
        f"{hybrid['prefill_tok_s'] / full['prefill_tok_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
