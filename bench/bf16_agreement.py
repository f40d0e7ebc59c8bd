"""Top-1 agreement of bfloat16 with float32, per family (a report, not a test).

For each tiny fine-tuned family: export in float32, rebuild the model from
the artifact in bfloat16 (`load_causal_lm(path, dtype="bfloat16")`), and
compare teacher-forced next-token argmax with float32 over the test corpus.
With `--engine`, the bfloat16 side is vLLM serving the artifact
(`KerasVllmEngine.from_export(path, dtype="bfloat16")`, prompt logprobs).

    .venv/bin/python bench/bf16_agreement.py [--engine] [--families a,b]
"""

import argparse
import tempfile

import numpy as np


def _teacher_forced_top1(causal_lm, ids):
    from keras_vllm import reference

    return np.argmax(reference.teacher_forced_logprobs(causal_lm, ids), -1)


TOP = 5


def _tied_best(logprobs):
    """The served top-1 token, or the set of tokens tied for it (bfloat16
    logits are coarse: several tokens can share the largest value)."""
    best = max(lp.logprob for lp in logprobs.values())
    tied = {t for t, lp in logprobs.items() if lp.logprob == best}
    return tied if len(tied) > 1 else tied.pop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", action="store_true")
    parser.add_argument("--families", default=None)
    args = parser.parse_args()

    import keras_vllm
    from keras_vllm import reference
    from keras_vllm import testing

    families = args.families.split(",") if args.families else testing.FAMILIES
    rows = []
    for family in families:
        causal_lm = testing.build_tiny_causal_lm(family)
        testing.fine_tune(causal_lm)
        path = causal_lm.export_vllm(
            tempfile.mkdtemp() + "/a", golden_prompts=["a"],
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
                [_tied_best(lp) for lp in out.prompt_logprobs[1:]]
                for out in outs
            ]
        else:
            bf16 = keras_vllm.load_causal_lm(path, dtype="bfloat16")
            low = [list(_teacher_forced_top1(bf16, s)[:-1]) for s in sequences]
        same = tied = total = 0
        for seq, lo in zip(sequences, low):
            hi = _teacher_forced_top1(causal_lm, seq)[:-1]
            for best, want in zip(lo, hi):
                best = best if isinstance(best, set) else {best}
                same += best == {want}
                tied += len(best) > 1 and want in best
            total += len(hi)
        rows.append((family, same, tied, total))
        print(f"{family:<10} top-1 agreement {same}/{total} = "
              f"{same / total:.4f}; + {tied} bf16 ties that include the "
              f"f32 choice = {(same + tied) / total:.4f}", flush=True)
    print("\n| family | bf16 vs f32 top-1 | counting bf16 ties |\n|---|---|---|")
    for family, same, tied, total in rows:
        print(f"| {family} | {same / total:.4f} ({same}/{total}) | "
              f"{(same + tied) / total:.4f} |")


if __name__ == "__main__":
    main()
