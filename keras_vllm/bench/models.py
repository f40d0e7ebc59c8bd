"""The benchmark's models, built offline with `keras_vllm.testing`.

- `tiny`: a 2.49M-parameter Qwen2 (4 layers, hidden 256). Host overhead per
  decode step dominates its time, so its ratios say more about the
  engines' overhead than about the model's arithmetic.
- `medium`: a ~128M-parameter Qwen2 (12 layers, hidden 768, GQA 12/4
  heads, a 32,000-token vocabulary), closer to what a fine-tuned model
  costs per step.

Both keep head_dim = hidden / query heads = 64 (tpu-inference's hd64 cache
layout) and tied embeddings (system B's tpu-inference Qwen2 fails on
untied text-only configs, see `prepare.fix_transformers_export`).
"""

MODELS = {
    # `keras_vllm.testing.build_tiny_causal_lm("qwen", ...)` overrides.
    "tiny": {
        "family": "qwen",
        "num_layers": 4,
        "hidden_dim": 256,
        "intermediate_dim": 512,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
    },
    # With tied embeddings, intermediate 3072 (rather than 2048) brings the
    # model to ~128M parameters: the size the benchmark is meant to show.
    # The fixture corpus trains ~700 BPE tokens; `vocabulary_size` fills the
    # tokenizer up with unused tokens so the embeddings have a real size.
    "medium": {
        "family": "qwen",
        "num_layers": 12,
        "hidden_dim": 768,
        "intermediate_dim": 3072,
        "num_query_heads": 12,
        "num_key_value_heads": 4,
        "vocabulary_size": 32000,
    },
}

# keras-vllm's CPU backend fakes this much device memory (GiB) per CPU
# device; with `gpu_memory_utilization` it sizes the (real, host) KV cache.
# The medium model's float32 weights alone take ~0.5 GB.
CPU_MEMORY_GB = {"tiny": "1", "medium": "4"}


def config(name):
    """The model's description as results record it (`config.model`).

    Args:
        name: string. A key of `MODELS`.

    Returns:
        A dict: `name`, `family` and the backbone overrides.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; one of {sorted(MODELS)}")
    return dict(MODELS[name], name=name)


def build(name, **backbone):
    """A fresh, randomly initialised model; equal calls give equal weights
    (`build_tiny_causal_lm` seeds its initialisation). `backbone`: more
    backbone arguments (e.g. `tie_word_embeddings=False`)."""
    from keras_vllm import testing

    overrides = {
        k: v for k, v in MODELS[name].items()
        if k not in ("family", "vocabulary_size")
    }
    overrides.update(backbone)
    vocabulary = MODELS[name].get("vocabulary_size")
    if vocabulary:
        overrides["filled_vocabulary"] = vocabulary
    return testing.build_tiny_causal_lm(MODELS[name]["family"], **overrides)


def perturb(causal_lm, seed=0):
    """Scales the random init so greedy output is not one repeated token.

    A freshly initialised tiny model with tied embeddings decodes one token
    over and over, which would make the output-agreement check vacuous.
    Embeddings x8 and kernels x3 give prompt-dependent, varied greedy output
    at the same cost.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    for variable in causal_lm.backbone.weights:
        path = variable.path
        value = np.asarray(variable.value)
        if "embeddings" in path:
            value = value * 8.0
        elif path.endswith("kernel"):
            value = value * 3.0
        elif path.endswith("bias"):
            value = rng.normal(0.0, 0.1, value.shape)
        elif path.endswith("scale"):
            value = 1.0 + rng.normal(0.0, 0.1, value.shape)
        variable.assign(value.astype(variable.dtype))
