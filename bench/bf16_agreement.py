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

            engine = keras_vllm.KerasVllmEngine.from_export(
                path, dtype="bfloat16"
            )
            outs = engine.generate(
                [{"prompt_token_ids": s} for s in sequences],
                SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0),
            )
            low = [
                [max(lp.items(), key=lambda kv: kv[1].logprob)[0]
                 for lp in out.prompt_logprobs[1:]]
                for out in outs
            ]
            del engine
        else:
            bf16 = keras_vllm.load_causal_lm(path, dtype="bfloat16")
            low = [list(_teacher_forced_top1(bf16, s)[:-1]) for s in sequences]
        same = total = 0
        for seq, lo in zip(sequences, low):
            hi = _teacher_forced_top1(causal_lm, seq)[:-1]
            same += int(np.sum(np.asarray(lo) == hi))
            total += len(hi)
        rows.append((family, same, total))
        print(f"{family:<10} top-1 agreement {same}/{total} = {same / total:.4f}",
              flush=True)
    print("\n| family | bf16 vs f32 top-1 |\n|---|---|")
    for family, same, total in rows:
        print(f"| {family} | {same / total:.4f} ({same}/{total}) |")


if __name__ == "__main__":
    main()
