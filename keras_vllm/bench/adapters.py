"""Multi-adapter LoRA: adapter bytes against full bytes, and the output rate
of one batch mixing several adapters against the same batch on the base.

```
python -m keras_vllm.bench.adapters [--models tiny,bench] [--serve tiny] [--adapters 4]
    [--prompts 16] [--max-tokens 32] [--reps 3] [--plain-engine]
```

Prints three tables:

1. **Bytes.** For each model (`tiny`: `build_tiny_causal_lm(--family)`;
   `bench`: the benchmark's tiny model, `keras_vllm.bench.models`) the base is exported full; a copy gets
   `enable_lora(--rank)` and a few fine-tuning steps and is exported as
   `weights="adapter"` (against the base) and as `weights="full"`. Each
   directory's file bytes are summed (tokenizer, config, manifest too).
2. **Llama-3-8B, computed** (no model built): Keras' LoRA factors on the
   layers `enable_lora` targets by default (the shape rule and the targets
   are checked on a tiny Llama) against all of the model's weights.
3. **Output tok/s.** One engine serves the base with `--adapters` adapters
   (`max_loras` = their number). The same prompts are generated with the
   adapters interleaved (prompt i uses adapter i mod n) and on the base
   alone, greedy, stop tokens ignored: a warm-up batch of each, then
   `--reps` timed batches of each, alternating; the best is kept.
   `--plain-engine` also times the base on an engine without LoRA.
"""

import argparse
import math
import os
import tempfile
import time

from keras_vllm.bench import engine_rate
from keras_vllm.bench import models
from keras_vllm.bench.prepare import dir_bytes

# Llama-3-8B (meta-llama/Meta-Llama-3-8B's config.json): untied embeddings.
LLAMA3_8B = {"vocabulary_size": 128256, "num_layers": 32, "hidden_dim": 4096,
             "intermediate_dim": 14336, "num_query_heads": 32,
             "num_key_value_heads": 8, "head_dim": 128}
BFLOAT16_BYTES = 2
FLOAT32_BYTES = 4


def lora_factor_shapes(kernel_shape, rank):
    """Keras' LoRA factor shapes for a kernel (`EinsumDense.enable_lora`).

    `lora_kernel_a` keeps every kernel axis but the last and adds the rank,
    so a 3-D attention kernel `(hidden, heads, head_dim)` gets a per-head A
    of `(hidden, heads, rank)`; `lora_kernel_b` is `(rank, kernel[-1])`.

    Args:
        kernel_shape: tuple of ints.
        rank: int.

    Returns:
        `(a_shape, b_shape)`.
    """
    return tuple(kernel_shape[:-1]) + (rank,), (rank, kernel_shape[-1])


def llama3_8b_parameters(rank, targets=("query", "value")):
    """Parameter counts of Llama-3-8B and of its Keras LoRA factors.

    Args:
        rank: int. The LoRA rank.
        targets: the attention kernels LoRA is enabled on.

    Returns:
        `(lora_parameters, model_parameters)`.
    """
    c = LLAMA3_8B
    hidden, heads, kv, head_dim = (c["hidden_dim"], c["num_query_heads"],
                                   c["num_key_value_heads"], c["head_dim"])
    # KerasHub's Llama attention kernels (llama_attention.py's equations).
    kernels = {"query": (hidden, heads, head_dim),
               "key": (hidden, kv, head_dim), "value": (hidden, kv, head_dim),
               "attention_output": (heads, head_dim, hidden)}
    mlp = 3 * hidden * c["intermediate_dim"]  # gate, up, down
    per_layer = sum(math.prod(s) for s in kernels.values()) + mlp + 2 * hidden
    # The embedding and the untied lm head, then the final norm.
    model = (c["num_layers"] * per_layer + 2 * c["vocabulary_size"] * hidden
             + hidden)
    lora = c["num_layers"] * sum(
        math.prod(a) + math.prod(b)
        for a, b in (lora_factor_shapes(kernels[t], rank) for t in targets)
    )
    return lora, model


def check_factor_rule(rank):
    """The LoRA layers a tiny Llama's `enable_lora(rank)` creates, each
    checked against `lora_factor_shapes`.

    Returns:
        The sorted names of the layers LoRA was enabled on.
    """
    from keras_vllm import testing
    from keras_vllm.export import adapter

    backbone = testing.build_tiny_causal_lm("llama").backbone
    backbone.enable_lora(rank)
    names = set()
    for layer in adapter.lora_layers(backbone):
        a, b = lora_factor_shapes(tuple(layer.kernel.shape), rank)
        assert tuple(layer.lora_kernel_a.shape) == a, (layer.path, a)
        assert tuple(layer.lora_kernel_b.shape) == b, (layer.path, b)
        names.add(layer.name)
    return sorted(names)


def build(model, family):
    """A fresh copy of `model` (`"tiny"` or `"bench"`); equal calls give
    equal weights (`build_tiny_causal_lm` seeds its initialisation)."""
    from keras_vllm import testing

    if model == "tiny":
        return testing.build_tiny_causal_lm(family)
    return models.build("tiny")


def export_all(model, family, root, count, rank, steps):
    """Exports the base (full) and `count` adapters of it, each fine-tuned
    with other sentences and seed; the first is also exported full.

    Returns:
        `(base_path, {name: adapter_path}, full_bytes_of_first_adapter,
        float32_bytes_of_its_lora_factors)`.
    """
    from keras_vllm import testing
    from keras_vllm.export import adapter

    kwargs = {"max_sequence_length": 256, "golden_prompts": []}
    os.makedirs(root, exist_ok=True)
    base = build(model, family).export_vllm(os.path.join(root, "base"),
                                            weights="full", **kwargs)
    corpus = testing.corpus()
    paths, full = {}, None
    for i in range(count):
        causal_lm = build(model, family)
        causal_lm.backbone.enable_lora(rank)
        # Other sentences per adapter so the adapters' factors differ.
        texts = corpus[i::count] or corpus
        testing.fine_tune(causal_lm, steps=steps, seed=i, texts=texts)
        name = f"a{i}"
        paths[name] = causal_lm.export_vllm(os.path.join(root, name), base=base,
                                            weights="adapter", **kwargs)
        if full is None:
            full = dir_bytes(causal_lm.export_vllm(
                os.path.join(root, name + "_full"), weights="full", **kwargs
            ))
            factors = sum(
                FLOAT32_BYTES * (math.prod(l.lora_kernel_a.shape)
                                 + math.prod(l.lora_kernel_b.shape))
                for l in adapter.lora_layers(causal_lm.backbone)
            )
    return base, paths, full, factors


def _timed(engine, prompts, params, adapter):
    """Seconds, output tokens and token ids of one `generate` call."""
    start = time.perf_counter()
    outputs = engine.generate(prompts, params, adapter=adapter, use_tqdm=False)
    seconds = time.perf_counter() - start
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    return seconds, sum(map(len, ids)), ids


def measure_mixed(base, paths, prompts, max_tokens, reps, plain=False):
    """Best output tok/s of the mixed batch and the base batch on one
    LoRA engine (and, with `plain`, the base on an engine without LoRA).

    Returns:
        A dict of rates, engine start seconds and how many prompts' greedy
        tokens differ between their adapter and the base.
    """
    import keras_vllm
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                            ignore_eos=True)
    names = sorted(paths)
    mixed = [names[i % len(names)] for i in range(len(prompts))]
    shapes = {"max_num_seqs": 16, "max_num_batched_tokens": 256,
              "verbose": False}
    result = {}
    start = time.perf_counter()
    # max_lora_rank defaults to the smallest of vLLM's ranks that fits.
    with keras_vllm.KerasVllmEngine.from_export(
        base, adapters=paths, max_loras=len(paths), **shapes
    ) as engine:
        result["lora_start_s"] = time.perf_counter() - start
        # Warm-up on other prompts: the first call of each kind loads the
        # adapters into their slots and pays any first-call costs.
        warm = prompts[::-1]
        _timed(engine, warm, params, mixed)
        _timed(engine, warm, params, None)
        best = {"mixed": 0.0, "base": 0.0}
        ids = {}
        # Alternating, so drift from the shared host hits both alike.
        for _ in range(reps):
            for kind, adapter in (("mixed", mixed), ("base", None)):
                seconds, tokens, ids[kind] = _timed(engine, prompts, params,
                                                    adapter)
                best[kind] = max(best[kind], tokens / seconds)
    result.update(best)
    result["differ"] = sum(a != b for a, b in zip(ids["mixed"], ids["base"]))
    if plain:
        start = time.perf_counter()
        with keras_vllm.KerasVllmEngine.from_export(base, **shapes) as engine:
            result["plain_start_s"] = time.perf_counter() - start
            _timed(engine, prompts[::-1], params, None)
            runs = [_timed(engine, prompts, params, None) for _ in range(reps)]
            result["plain"] = max(tokens / sec for sec, tokens, _ in runs)
    return result


def print_bytes(models, exports, args):
    """Table 1: the adapter's and the full artifact's bytes per model."""
    print(f"\nAdapter vs full artifact, enable_lora(rank={args.rank}), "
          f"{args.steps} fine-tuning steps, float32")
    # The weights' share shows what is fixed per artifact (tokenizer,
    # config, manifest) and what the adapter stores beyond the factors.
    print("| model | adapter bytes | of which weights/ | LoRA factors | "
          "full bytes | adapter / full |")
    print("|---|---|---|---|---|---|")
    for model in models:
        _, paths, full, factors = exports[model]
        adapter = dir_bytes(paths["a0"])
        weights = dir_bytes(os.path.join(paths["a0"], "weights"))
        print(f"| {model} | {adapter} | {weights} | {factors} | {full} | "
              f"{adapter / full:.2%} |")


def print_llama3(rank):
    """Table 2: Llama-3-8B's LoRA factor bytes against its weights."""
    targets = check_factor_rule(rank)
    lora, total = llama3_8b_parameters(rank)
    print(f"\nLlama-3-8B, computed: LoRA rank {rank} on {targets} "
          "(enable_lora's default targets on a tiny Llama)")
    print("| factors stored as | LoRA bytes | model bytes (bfloat16) | ratio |")
    print("|---|---|---|---|")
    for label, size in (("bfloat16", BFLOAT16_BYTES),
                        ("float32 (Keras' LoRA dtype)", FLOAT32_BYTES)):
        print(f"| {label} | {lora * size} | {total * BFLOAT16_BYTES} | "
              f"{lora * size / (total * BFLOAT16_BYTES):.3%} |")


def print_rates(served, exports, args):
    """Table 3: mixed-adapter and base output rates per served model."""
    prompts = engine_rate.corpus_prompts(args.prompts)
    print(f"\n{args.prompts} prompts x {args.max_tokens} tokens, greedy, "
          f"{args.adapters} adapters on one engine, best of {args.reps}")
    rows = [(model, measure_mixed(*exports[model][:2], prompts, args.max_tokens,
                                  args.reps, args.plain_engine))
            for model in served]
    plain = " base, no-LoRA engine |" if args.plain_engine else ""
    print(f"| model | mixed tok/s | base tok/s | mixed / base |{plain} "
          "differ from base | LoRA engine start (s) |")
    print("|---|---|---|---|" + ("---|" if plain else "") + "---|---|")
    for model, r in rows:
        extra = f" {r['plain']:.1f} |" if plain else ""
        print(f"| {model} | {r['mixed']:.1f} | {r['base']:.1f} | "
              f"{r['mixed'] / r['base']:.3f} |{extra} "
              f"{r['differ']}/{args.prompts} | {r['lora_start_s']:.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,bench")  # bytes measured
    parser.add_argument("--serve", default="tiny")  # served ('' for none)
    parser.add_argument("--family", default="llama", help="the tiny model's")
    for flag, default in (("--rank", 8), ("--steps", 3), ("--adapters", 4),
                          ("--prompts", 16), ("--max-tokens", 32),
                          ("--reps", 3)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--plain-engine", action="store_true")
    args = parser.parse_args()

    models = [m for m in args.models.split(",") if m]
    served = [m for m in args.serve.split(",") if m]
    with tempfile.TemporaryDirectory() as root:
        exports = {}
        for model in dict.fromkeys(models + served):
            # Only the served models need all the adapters.
            count = args.adapters if model in served else 1
            exports[model] = export_all(model, args.family, os.path.join(
                root, model), count, args.rank, args.steps)

        if models:
            print_bytes(models, exports, args)
        print_llama3(args.rank)
        if served:
            print_rates(served, exports, args)


if __name__ == "__main__":
    main()
