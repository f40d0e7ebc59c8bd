"""Preparation: the benchmark model in every format the systems read (runs
in the "prepare" worker)."""

import json
import os
import time

from keras_vllm.bench import measure
from keras_vllm.bench import models


def dir_bytes(path):
    """Total size of the files under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


# Hugging Face architecture names of the benchmark models' families, for a
# `config.json` that keras-hub 0.32 writes without them.
_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def fix_transformers_export(directory, dtype="float32"):
    """Makes keras-hub 0.32's `export_to_transformers` output load in vLLM.

    Two fixes (verified on keras-hub 0.32.0 / vLLM 0.32.0): `config.json`
    gets `architectures` (without it vLLM resolves `Qwen2Model`, which
    tpu-inference does not implement) and `torch_dtype`; a `lm_head.weight`
    stored beside tied embeddings is dropped (vLLM then unties the
    embeddings, and tpu-inference's untied Qwen2 path fails on text-only
    configs). The dropped tensor is checked to equal the embeddings.
    `dtype` is the weights' dtype, `torch_dtype` where the config has none.

    Returns:
        A list of strings describing what was changed.
    """
    import numpy as np
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    changes = []
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if not config.get("architectures"):
        config["architectures"] = [_ARCHITECTURES[config["model_type"]]]
        changes.append(f"architectures={config['architectures']}")
    config.setdefault("torch_dtype", dtype)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    weights_path = os.path.join(directory, "model.safetensors")
    tensors = load_file(weights_path)
    if config.get("tie_word_embeddings") and "lm_head.weight" in tensors:
        head = tensors.pop("lm_head.weight")
        embed = tensors["model.embed_tokens.weight"]
        if not np.array_equal(head, embed):
            raise ValueError("lm_head.weight differs from the embeddings")
        save_file(tensors, weights_path, metadata={"format": "pt"})
        changes.append("dropped tied lm_head.weight")
    return changes


def prompt_id_range(tokenizer):
    """`[first, limit)`: the ids random prompts draw from, holding no
    special token id: those below the first special id where the specials
    follow the learned tokens (byte-level BPE), else those above the last
    (SentencePiece vocabularies put them first)."""
    special = sorted(int(i) for i in tokenizer.special_token_ids)
    vocabulary = int(tokenizer.vocabulary_size())
    if special[0] > vocabulary // 2:
        return [0, special[0]]
    return [special[-1] + 1, vocabulary]


def prepare(workdir, max_model_len, model="tiny", lora_steps=None):
    """Builds the model and writes it in every format; returns timings.

    Args:
        workdir: string. The directory the formats are written under.
        max_model_len: int. The exports' maximum sequence length.
        model: string. A key of `models.MODELS`.
        lora_steps: int. Fine-tuning steps before the LoRA delta export
            (0: none). Default: the model's `lora_steps`, else 3.

    Returns:
        A dict: `model` (its description, parameter count, vocabulary),
        `exports` (seconds and bytes of each), `lora` and `paths`.
    """
    import keras_hub
    import numpy as np

    import keras_vllm
    from keras_vllm import testing

    description = models.config(model)
    causal_lm = models.build(model)
    models.perturb(causal_lm)
    tokenizer = causal_lm.preprocessor.tokenizer
    result = {
        "model": dict(
            description,
            parameters=int(causal_lm.backbone.count_params()),
            vocabulary_size=int(tokenizer.vocabulary_size()),
            prompt_ids=prompt_id_range(tokenizer),
            dtype=models.dtype(model),
        )
    }
    # A short greedy run, to record how varied the output is.
    sample = np.arange(32, dtype="int32")[None, :] + 7
    ids = measure.keras_generate(causal_lm, sample.tolist(), 32)[0]
    result["model"]["sample_distinct_tokens"] = len(set(ids))

    paths = {
        "preset": os.path.join(workdir, "preset"),
        "ours": os.path.join(workdir, "artifact"),
        "transformers": os.path.join(workdir, "transformers"),
        "lora": os.path.join(workdir, "artifact_lora"),
    }
    exports = {}

    start = time.perf_counter()
    causal_lm.save_to_preset(paths["preset"])
    exports["save_to_preset"] = {
        "seconds": time.perf_counter() - start,
        "bytes": dir_bytes(paths["preset"]),
    }
    start = time.perf_counter()
    keras_vllm.export_vllm(
        causal_lm,
        paths["ours"],
        weights="full",
        max_sequence_length=max_model_len,
        overwrite=True,
    )
    exports["export_vllm"] = {
        "seconds": time.perf_counter() - start,
        "bytes": dir_bytes(paths["ours"]),
        "note": "weights='full'; includes golden greedy outputs and "
        "checksums",
    }
    # The same export without golden outputs (generate() runs per prompt).
    no_golden = os.path.join(workdir, "artifact_no_golden")
    start = time.perf_counter()
    keras_vllm.export_vllm(
        causal_lm,
        no_golden,
        weights="full",
        max_sequence_length=max_model_len,
        overwrite=True,
        golden_prompts=(),
    )
    exports["export_vllm_no_golden"] = {
        "seconds": time.perf_counter() - start,
        "bytes": dir_bytes(no_golden),
    }
    start = time.perf_counter()
    causal_lm.export_to_transformers(paths["transformers"])
    seconds = time.perf_counter() - start
    exports["export_to_transformers"] = {
        "seconds": seconds,
        "bytes": dir_bytes(paths["transformers"]),
    }
    exports["export_to_transformers"]["fixes"] = fix_transformers_export(
        paths["transformers"], models.dtype(model)
    )
    exports["export_to_transformers"]["bytes_after_fixes"] = dir_bytes(
        paths["transformers"]
    )

    result["exports"] = exports
    result["paths"] = paths
    if lora_steps is None:
        lora_steps = models.MODELS[model].get("lora_steps", 3)
    if not lora_steps:
        return result
    # LoRA: fine-tune the preset briefly, export the delta against it.
    tuned = keras_hub.models.CausalLM.from_preset(paths["preset"])
    tuned.compile(sampler="greedy")
    tuned.backbone.enable_lora(rank=8)
    testing.fine_tune(tuned, steps=lora_steps)
    start = time.perf_counter()
    keras_vllm.export_vllm(
        tuned, paths["lora"], max_sequence_length=max_model_len,
        overwrite=True,
    )
    seconds = time.perf_counter() - start
    manifest = json.load(
        open(os.path.join(paths["lora"], "manifest.json"))
    )
    result["lora"] = {
        "rank": 8,
        "steps": lora_steps,
        "export_seconds": seconds,
        "delta_bytes": dir_bytes(paths["lora"]),
        "full_bytes": exports["export_vllm"]["bytes"],
        "weights_mode": manifest["weights"]["mode"],
    }
    return result

