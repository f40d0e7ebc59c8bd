"""Decode tokens/s and acceptance with and without n-gram speculation.

```
python -m keras_vllm.bench.speculative                  # --model tiny
python -m keras_vllm.bench.speculative --model medium --new-tokens 32
```

One model of `keras_vllm.bench.models` (random weights: speed does not
depend on their values), in two workloads, each served by two engines, one
after the other: without speculation, and with n-gram speculation
(`speculative_config={"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_min": 2, "prompt_lookup_max": 4}`):

- `repeating`: the model with its kernels scaled by 1e-3, so every
  position's hidden state is its own token's embedding and greedy decoding
  (tied embeddings) repeats the prompt's last token over and over: text
  that repeats itself, where every draft the n-gram lookup makes is
  accepted once the output has repeated (the best case; code edits,
  extraction and other output that copies its context come close to it);
- `cycling`: the same, with an output head of its own (untied) whose
  column for each token reads the embedding of the token before it in a
  fixed group of `CYCLE` ids, so greedy decoding goes round that group from
  the prompt's last token: text that repeats a 5-token phrase, where the
  lookup must continue the phrase from the right place (a draft one token
  late is rejected here, where in `repeating` it is the same token);
- `varied`: the model rescaled as the main benchmark's (`models.perturb`),
  whose greedy output varies with the prompt and rarely repeats a pair of
  tokens the lookup could draft from.

The table's last columns say how to read other workloads: n-gram / plain
is about the tokens a verify step yields times plain step / verify step.

Per engine and concurrency (1 and 8 by default): the decode rate, in
tokens/s over all sequences, from the time of `1 + n` new tokens minus
that of 1 (the prefill), each the fastest of 3 runs after one that
compiles, on 32-token random prompts (other prompts per run, prefix
caching off), and the engine's cold start (a compile cache of its own);
with speculation, the acceptance from vLLM's per-request
metrics of the `1 + n` runs: accepted / drafted tokens and the mean tokens
a verify step yields. The speculative engine's greedy outputs are compared
with the plain one's, request by request. Prints the load average: the
host may be shared.
"""

import argparse
import gc
import json
import os
import time

from keras_vllm.bench import engine_rate
from keras_vllm.bench import models

SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}
WORKLOADS = ("repeating", "cycling", "varied")
# The `cycling` workload's period, in tokens.
CYCLE = 5
PROMPT_TOKENS = 32
REPEATS = 3


def _random_prompts(vocabulary):
    def prompts(count, seed):
        import numpy as np

        rng = np.random.default_rng(seed)
        return [
            {"prompt_token_ids":
             rng.integers(0, vocabulary, PROMPT_TOKENS).tolist()}
            for _ in range(count)
        ]

    return prompts


def repeat_last_token(causal_lm):
    """Scales every kernel by 1e-3: the layers add next to nothing to the
    embeddings, so each position's logits (tied embeddings) pick its own
    token."""
    for variable in causal_lm.backbone.weights:
        if variable.path.endswith("kernel"):
            variable.assign(variable.value * 1e-3)


def cycle_through(causal_lm, vocabulary, period=CYCLE):
    """Makes greedy decoding go round groups of `period` token ids.

    Ids below `vocabulary` fall in groups `[g * period, (g + 1) * period)`;
    the token after `t` is the next id of its group (wrapping). With the
    kernels scaled down (`repeat_last_token`) each position's hidden state
    points along its own token's embedding, so an output head whose column
    for `s` is the embedding of the token `s` follows scores that token
    highest. Needs an untied head (`tie_word_embeddings=False`).
    """
    import numpy as np

    repeat_last_token(causal_lm)
    embedding = causal_lm.backbone.token_embedding
    if getattr(embedding, "tie_weights", True):
        raise ValueError("cycle_through needs an untied output head.")
    table = np.asarray(embedding.embeddings)
    ids = np.arange(table.shape[0])
    grouped = ids < vocabulary - vocabulary % period
    following = np.where(
        grouped, ids - ids % period + (ids + 1) % period, ids
    )
    previous = np.empty_like(ids)
    previous[following] = ids
    head = table[previous].T
    embedding.reverse_embeddings.assign(
        head.astype(embedding.reverse_embeddings.dtype)
    )
    return following


def workload_artifact(model_name, workload):
    """Exports `model_name`'s bench model shaped for `workload`
    (`WORKLOADS`); returns the artifact's path and the vocabulary random
    prompts draw from (ids below the first special token)."""
    untied = {"tie_word_embeddings": False} if workload == "cycling" else {}
    model = models.build(model_name, **untied)
    tokenizer = model.preprocessor.tokenizer
    special = [int(i) for i in tokenizer.special_token_ids]
    vocabulary = min(special) if special else tokenizer.vocabulary_size()
    if workload == "varied":
        models.perturb(model)
    elif workload == "cycling":
        cycle_through(model, vocabulary)
    else:
        repeat_last_token(model)
    return engine_rate.export(model, workload), vocabulary


def run(engine, prompts, max_tokens):
    """Seconds and vLLM outputs of one greedy `generate` of `prompts`."""
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True
    )
    start = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, outputs


def measure(path, vocabulary, new_tokens, concurrencies, speculative,
            prompts=None, **engine_kwargs):
    """Decode tokens/s (and acceptance) of one engine per concurrency.

    Args:
        path: the artifact.
        vocabulary: prompts draw token ids below it.
        new_tokens: tokens timed per request after the first.
        concurrencies: requests per batch, one cell each.
        speculative: a `speculative_config` dict, True for
            `SPECULATIVE_CONFIG` (n-gram), or falsy for none.
        prompts: `prompts(count, seed)` -> vLLM prompts; random token ids
            by default.
        **engine_kwargs: more `KerasVllmEngine.from_export` arguments of
            the speculating engine (`additional_config`, ...).

    Returns:
        `{"start_seconds": the engine's cold start, concurrency:
        {"decode_tok_s", "accepted", "drafted", "verify_steps",
        "outputs"}}`; `outputs` are the token ids of the timed `1 + n`
        runs' requests.
    """
    import keras_vllm

    kwargs = dict(
        max_num_seqs=max(16, max(concurrencies)), enable_prefix_caching=False
    )
    if speculative:
        kwargs.update(
            speculative_config=(
                SPECULATIVE_CONFIG if speculative is True else speculative
            ),
            per_request_spec_decode_metrics="summary",
            **engine_kwargs,
        )
    # A cold start, as a first start or CI's: compiled programs of the
    # other engine are not reused.
    os.environ["VLLM_XLA_CACHE_PATH"] = engine_rate.temporary_directory()
    start = time.perf_counter()
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, verbose=False, **kwargs
    )
    result = {"start_seconds": time.perf_counter() - start}
    draw = prompts or _random_prompts(vocabulary)
    try:
        for concurrency in concurrencies:
            runs = {1: [], 1 + new_tokens: []}
            for repeat in range(REPEATS + 1):
                for tokens in runs:
                    # The same prompts for both engines of a workload.
                    seed = concurrency * 1000 + repeat * 10 + (tokens > 1)
                    batch = draw(concurrency, seed)
                    runs[tokens].append(run(engine, batch, tokens))
            first = min(runs[1][1:], key=lambda run: run[0])[0]
            timed = runs[1 + new_tokens][1:]
            seconds = min(run[0] for run in timed)
            cell = {
                "decode_tok_s": concurrency * new_tokens / (seconds - first),
                # Every timed run's, in order: the same prompts in both
                # engines of a workload.
                "outputs": [list(o.outputs[0].token_ids)
                            for _, outs in timed for o in outs],
            }
            if speculative:
                metrics = [
                    o.outputs[0].spec_decode_metrics
                    for _, outs in runs[1 + new_tokens][1:] for o in outs
                ]
                cell["drafted"] = sum(m.num_draft_tokens for m in metrics)
                cell["accepted"] = sum(
                    j * count for m in metrics
                    for j, count in enumerate(m.histogram)
                )
                cell["verify_steps"] = sum(sum(m.histogram) for m in metrics)
            result[concurrency] = cell
    finally:
        engine.shutdown()
        # An in-process engine (vLLM's single-process mode, as on a TPU host
        # without sockets) frees its device KV cache only once collected;
        # the next engine would not fit beside it.
        del engine
        gc.collect()
    return result


def acceptance(cell):
    if not cell.get("drafted"):
        return "no drafts", "-"
    rate = cell["accepted"] / cell["drafted"]
    per_step = 1 + cell["accepted"] / cell["verify_steps"]
    return f"{rate:.0%}", f"{per_step:.2f}"


def step_ratio(plain, ngram):
    """A verify step's time over a plain step's, from the decode rates and
    the tokens a verify step yields (as if every step verified drafts)."""
    if not ngram.get("verify_steps"):
        return "-"
    tokens = 1 + ngram["accepted"] / ngram["verify_steps"]
    return f"{tokens * plain['decode_tok_s'] / ngram['decode_tok_s']:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=sorted(models.MODELS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrencies", default="1,8")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--speculative-config", type=json.loads, default=SPECULATIVE_CONFIG,
        help="the speculating engine's config (JSON), e.g. with "
        "num_speculative_tokens_per_batch_size",
    )
    parser.add_argument(
        "--additional-config", type=json.loads, default=None,
        help='the speculating engine\'s additional_config (JSON), e.g. '
        '{"min_draft_acceptance": 0.3}',
    )
    args = parser.parse_args()
    extra = {}
    if args.additional_config:
        extra["additional_config"] = args.additional_config
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    os.environ.setdefault(
        "KERAS_VLLM_CPU_MEMORY_GB", models.CPU_MEMORY_GB[args.model]
    )
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows, starts = [], []
    for workload in args.workloads.split(","):
        path, vocabulary = workload_artifact(args.model, workload)
        plain = measure(path, vocabulary, args.new_tokens, concurrencies, False)
        ngram = measure(
            path, vocabulary, args.new_tokens, concurrencies,
            args.speculative_config, **extra,
        )
        starts.append(
            f"{workload}: {plain['start_seconds']:.0f} s plain, "
            f"{ngram['start_seconds']:.0f} s n-gram"
        )
        for c in concurrencies:
            same = sum(
                a == b for a, b in zip(plain[c]["outputs"], ngram[c]["outputs"])
            )
            rate, per_step = acceptance(ngram[c])
            rows.append([
                workload, str(c), f"{plain[c]['decode_tok_s']:.1f}",
                f"{ngram[c]['decode_tok_s']:.1f}",
                f"{ngram[c]['decode_tok_s'] / plain[c]['decode_tok_s']:.2f}",
                rate, per_step, step_ratio(plain[c], ngram[c]),
                f"{same}/{len(plain[c]['outputs'])}",
            ])
    print(f"\n--model {args.model}, {args.new_tokens} new tokens after a "
          f"{PROMPT_TOKENS}-token prompt, fastest of {REPEATS} runs; n-gram "
          f"{args.speculative_config}"
          + (f", additional_config {args.additional_config}" if extra else "")
          + f"; load average at the end: {os.getloadavg()}")
    header = ["workload", "concurrency", "decode tok/s plain",
              "decode tok/s n-gram", "n-gram / plain", "drafts accepted",
              "tokens per verify step", "verify step / plain step",
              "greedy outputs equal"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("Cold engine starts (own compile cache each): " + "; ".join(starts))


if __name__ == "__main__":
    main()
