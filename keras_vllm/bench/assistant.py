"""Decode tokens/s with and without Gemma 4's assistant drafting (MTP).

```
python -m keras_vllm.bench.assistant
python -m keras_vllm.bench.assistant --drafts 3 --new-tokens 32 --concurrencies 1,8
```

A tiny Gemma 4 target (`keras_vllm.testing.build_tiny_causal_lm
("gemma4_e2b")`) fine-tuned on the fixture corpus, so its continuations
depend on the prompt, and a tiny `Gemma4AssistantCausalLM` distilled from it
(`keras_vllm.testing.assistants`), both exported (`export_vllm`,
`export_assistant`); the target served twice, one engine after the other:
plain, and with `{"method": "mtp", "model": ASSISTANT,
"num_speculative_tokens": N}`. Prompts are the fixture's text prompts (the
assistant's training domain, so acceptance is what a well-matched assistant
gets), cycled to each concurrency. Timing as `keras_vllm.bench.speculative`:
decode rate from the time of `1 + n` new tokens minus that of 1, fastest of
3 runs after a compiling one, prefix caching off; acceptance from vLLM's
per-request metrics; greedy outputs compared request by request.

At this size a step's cost is mostly the engine's own overhead, not the
model's arithmetic, so the ratio says how much drafting saves in steps, not
what a 2B target with its 4-layer assistant gains on a TPU.
"""

import argparse
import os

from keras_vllm.bench import engine_rate
from keras_vllm.bench import speculative

FAMILY = "gemma4_e2b"


def _text_prompts(texts):
    def prompts(count, seed):
        return [texts[(seed + i) % len(texts)] for i in range(count)]

    return prompts


def build(steps, drafts, distill_steps):
    """Exports the fine-tuned target and its distilled assistant.

    Returns:
        `(target_path, assistant_path, prompts)`.
    """
    import keras_vllm
    from keras_vllm import testing
    from keras_vllm.testing import assistants

    target = testing.build_tiny_causal_lm(FAMILY)
    target.compile(sampler="greedy")
    testing.fine_tune(target, steps=steps)
    assistant = assistants.build_tiny_assistant(
        target, num_speculative_tokens=drafts, ordered_embeddings=True
    )
    assistants.fine_tune_assistant(assistant, target, steps=distill_steps)
    root = engine_rate.temporary_directory()
    target_path = target.export_vllm(
        os.path.join(root, "target"), max_sequence_length=256,
        golden_prompts=[],
    )
    assistant_path = keras_vllm.export_assistant(
        assistant, os.path.join(root, "assistant"), target=target_path
    )
    return target_path, assistant_path, testing.prompts()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100,
                        help="the target's fine-tuning steps")
    parser.add_argument("--distill-steps", type=int, default=600)
    parser.add_argument("--drafts", type=int, default=3,
                        help="num_speculative_tokens")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--concurrencies", default="1,8")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    target, assistant, texts = build(args.steps, args.drafts,
                                     args.distill_steps)
    prompts = _text_prompts(texts)
    config = {"method": "mtp", "model": assistant,
              "num_speculative_tokens": args.drafts}
    plain = speculative.measure(target, None, args.new_tokens, concurrencies,
                                None, prompts=prompts)
    mtp = speculative.measure(target, None, args.new_tokens, concurrencies,
                              config, prompts=prompts)
    print(f"\n{FAMILY} fixture, {args.new_tokens} new tokens, fastest of "
          f"{speculative.REPEATS} runs; {args.drafts} drafts a step; load "
          f"average at the end: {os.getloadavg()}")
    header = ["concurrency", "decode tok/s plain", "decode tok/s MTP",
              "MTP / plain", "drafts accepted", "tokens per verify step",
              "verify step / plain step", "greedy outputs equal"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for c in concurrencies:
        same = sum(a == b for a, b in zip(plain[c]["outputs"],
                                          mtp[c]["outputs"]))
        rate, per_step = speculative.acceptance(mtp[c])
        row = [
            str(c), f"{plain[c]['decode_tok_s']:.1f}",
            f"{mtp[c]['decode_tok_s']:.1f}",
            f"{mtp[c]['decode_tok_s'] / plain[c]['decode_tok_s']:.2f}",
            rate, per_step, speculative.step_ratio(plain[c], mtp[c]),
            f"{same}/{len(plain[c]['outputs'])}",
        ]
        print("| " + " | ".join(row) + " |")
    print(f"Cold engine starts (own compile cache each): "
          f"{plain['start_seconds']:.0f} s plain, "
          f"{mtp['start_seconds']:.0f} s MTP")


if __name__ == "__main__":
    main()
