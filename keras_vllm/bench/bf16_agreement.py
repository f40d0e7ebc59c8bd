"""Top-1 agreement of bfloat16 with float32, per family (a report, not a test).

For each tiny fine-tuned family: export in float32, rebuild the model from
the artifact in bfloat16 (`load_causal_lm(path, dtype="bfloat16")`), and
compare teacher-forced next-token argmax with float32 over the test corpus.
With `--engine`, the bfloat16 side is vLLM serving the artifact
(`KerasVllmEngine.from_export(path, dtype="bfloat16")`, prompt logprobs).

    python -m keras_vllm.bench.bf16_agreement [--engine] [--families a,b]
"""

import argparse

import numpy as np

from keras_vllm.bench import engine_rate


def _teacher_forced_top1(causal_lm, ids):
    from keras_vllm.hub import reference

    return np.argmax(reference.teacher_forced_logprobs(causal_lm, ids), -1)


TOP = 5


def _served_row(logprobs):
    """`{token: logprob}` of vLLM's top tokens at one position."""
    return {t: lp.logprob for t, lp in logprobs.items()}


def _keras_row(logprobs):
    """`{token: logprob}` of the `TOP` best tokens of a Keras row."""
    top = np.argsort(logprobs)[::-1][:TOP]
    return {int(t): float(logprobs[t]) for t in top}


def _compare(row, want):
    """("same" | "tie" | "differs", gap): bfloat16 logits are coarse, so
    several tokens can share the top value ("tie" when the float32 choice
    is one of them); `gap` is how far below the top the float32 choice is
    (inf when it is not among the top tokens)."""
    best = max(row.values())
    winners = {t for t, v in row.items() if v == best}
    if winners == {want}:
        return "same", 0.0
    if want in winners:
        return "tie", 0.0
    return "differs", best - row.get(want, -np.inf)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", action="store_true")
    parser.add_argument("--families", default=None)
    args = parser.parse_args()

    import keras_vllm
    from keras_vllm.hub import reference
    from keras_vllm import testing

    families = args.families.split(",") if args.families else testing.FAMILIES
    rows = []
    for family in families:
        causal_lm = testing.build_tiny_causal_lm(family)
        testing.fine_tune(causal_lm)
        path = causal_lm.export_vllm(
            engine_rate.temporary_directory() + "/a", golden_prompts=["a"],
            max_sequence_length=256,
        )
        sequences = [
            reference.prompt_token_ids(causal_lm, t) for t in testing.corpus()
        ]
        if args.engine:
            from vllm import SamplingParams

            with keras_vllm.KerasVllmEngine.from_export(
                path, dtype="bfloat16"
            ) as engine:
                outs = engine.generate(
                    [{"prompt_token_ids": s} for s in sequences],
                    SamplingParams(
                        max_tokens=1, prompt_logprobs=TOP, temperature=0
                    ),
                )
            low = [
                [_served_row(lp) for lp in out.prompt_logprobs[1:]]
                for out in outs
            ]
        else:
            bf16 = keras_vllm.load_causal_lm(path, dtype="bfloat16")
            low = [
                [_keras_row(row) for row in
                 reference.teacher_forced_logprobs(bf16, s)[:-1]]
                for s in sequences
            ]
        counts = {"same": 0, "tie": 0, "differs": 0}
        gap = 0.0
        where = set()
        for seq, rows_bf16 in zip(sequences, low):
            hi = _teacher_forced_top1(causal_lm, seq)[:-1]
            for position, (row, want) in enumerate(zip(rows_bf16, hi)):
                kind, distance = _compare(row, int(want))
                counts[kind] += 1
                gap = max(gap, distance)
                if kind == "differs":
                    where.add(position)
        total = sum(counts.values())
        rows.append((family, counts, total, gap))
        print(f"{family:<10} same {counts['same']}/{total}, bf16 ties "
              f"{counts['tie']}, differs {counts['differs']} (largest gap "
              f"{gap:.4f} nats, at positions {sorted(where)})", flush=True)
    print("\n| family | bf16 vs f32 top-1 | counting bf16 ties | largest gap "
          "where they differ |\n|---|---|---|---|")
    for family, counts, total, gap in rows:
        print(f"| {family} | {counts['same'] / total:.4f} "
              f"({counts['same']}/{total}) | "
              f"{(counts['same'] + counts['tie']) / total:.4f} | "
              f"{gap:.4f} |")

if __name__ == "__main__":
    main()
