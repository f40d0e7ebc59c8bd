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

The seed's table (issue #58) used bfloat16 models of ~1B parameters; these
have their shapes and vocabulary sizes, random weights (built where they
run: nothing downloads), in bfloat16:

- `gpt2_large`: GPT-2 large (774M: 36 layers, hidden 1280, 20 heads).
- `llama3_1b`: Llama 3.2 1B (1.24B: 16 layers, hidden 2048, GQA 32/8,
  tied embeddings, a 128,256-token vocabulary, RoPE scaling factor 32).
- `gemma3_1b`: Gemma 3 1B (1.0B: 26 layers, hidden 1152, 4 query heads of
  256 over one KV head, a sliding window of 512 on 5 layers of 6, a
  262,144-token vocabulary).
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
    # The seed table's models: no LoRA fine-tune in their preparation (its
    # compile would take a minute of a device call).
    "gpt2_large": {
        "lora_steps": 0,
        "family": "gpt2",
        "dtype": "bfloat16",
        "num_layers": 36,
        "hidden_dim": 1280,
        "num_heads": 20,
        "intermediate_dim": 5120,
        "max_sequence_length": 1024,
        "vocabulary_size": 50257,
    },
    "llama3_1b": {
        "lora_steps": 0,
        "family": "llama3",
        "dtype": "bfloat16",
        "num_layers": 16,
        "hidden_dim": 2048,
        "intermediate_dim": 8192,
        "num_query_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
        "rope_frequency_adjustment_factor": 32.0,
        "vocabulary_size": 128256,
    },
    "gemma3_1b": {
        "lora_steps": 0,
        "family": "gemma3",
        "dtype": "bfloat16",
        "num_layers": 26,
        "hidden_dim": 1152,
        "intermediate_dim": 6912,
        "num_query_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window_size": 512,
        "vocabulary_size": 262144,
    },
}
# Description keys that are not backbone arguments.
_NOT_BACKBONE = ("family", "vocabulary_size", "dtype", "lora_steps")

# keras-vllm's CPU backend fakes this much device memory (GiB) per CPU
# device; with `gpu_memory_utilization` it sizes the (real, host) KV cache.
# The medium model's float32 weights alone take ~0.5 GB.
CPU_MEMORY_GB = {"tiny": "1", "medium": "4", "gpt2_large": "8",
                 "llama3_1b": "8", "gemma3_1b": "8"}


def dtype(name):
    """The model's weights' dtype: `"float32"` unless its entry says."""
    return MODELS[name].get("dtype", "float32")


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
        k: v for k, v in MODELS[name].items() if k not in _NOT_BACKBONE
    }
    overrides.update(backbone)
    vocabulary = MODELS[name].get("vocabulary_size")
    if vocabulary:
        overrides["filled_vocabulary"] = vocabulary
    return testing.build_tiny_causal_lm(
        MODELS[name]["family"], dtype=MODELS[name].get("dtype"), **overrides
    )


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
