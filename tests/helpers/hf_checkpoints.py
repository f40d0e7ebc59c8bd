"""Tiny Hugging Face (transformers) checkpoints, written locally.

Each is what `save_pretrained` writes (config.json and model.safetensors,
or sharded safetensors with their index) plus the tokenizer files
keras-hub's converter for the family reads, trained on the fixture corpus
by `keras_vllm.testing.tokenizers`. No network.
"""

import json
import os

import numpy as np

from helpers import hf_published
from keras_vllm.testing import tokenizers as tokenizers_lib

# family -> (tokenizer kind, keras-vllm tokenizer layout).
_TOKENIZERS = {
    "llama": ("bpe", "llama3"),
    "qwen2": ("bpe", "qwen"),
    "gpt2": ("bpe", "gpt2"),
    "gemma2": ("spm", "gemma"),
    "mistral": ("spm", "llama"),
    "gemma": ("spm", "gemma"),
    "gemma3": ("spm", "gemma"),
    "mixtral": ("spm", "llama"),
    "qwen3": ("bpe", "qwen"),
    "qwen_moe": ("bpe", "qwen"),
    "qwen3_moe": ("bpe", "qwen"),
    "smollm3": ("bpe", "smollm3"),
    "gemma4": ("spm_json", "gemma4"),
    "gpt_oss": ("bpe", "gpt_oss"),
    "qwen3_5": ("bpe", "qwen3_5"),
    "qwen3_5_moe": ("bpe", "qwen3_5"),
}
FAMILIES = tuple(_TOKENIZERS)


def _write_json(directory, name, value):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        json.dump(value, f)


# The chat templates instruction-tuned checkpoints carry, in the three places
# transformers has written them: `tokenizer_config.json` (a string, or named
# templates) and `chat_template.jinja`.
CHAT_TEMPLATES = {
    "llama": (
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] "
        "{{ m['content'] | trim }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    ),
    "qwen2": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "gemma2": (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
        "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    ),
}


def _write_chat_template(family, directory):
    template = CHAT_TEMPLATES.get(family)
    if family == "qwen2":
        with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
            f.write(template)
        return
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
        with open(config_path) as f:
            config = json.load(f)
    if family == "llama":
        config["chat_template"] = template
    elif family == "gemma2":
        config["chat_template"] = [
            {"name": "tool_use", "template": "{{ 'tools' }}"},
            {"name": "default", "template": template},
        ]
    else:
        return
    _write_json(directory, "tokenizer_config.json", config)


def _write_tokenizer(family, directory):
    """Writes the tokenizer files; returns the vocabulary size."""
    kind, layout = _TOKENIZERS[family]
    if kind == "spm_json":
        return hf_published.write_sentence_piece_json(layout, directory)
    if kind == "spm":
        import sentencepiece

        proto = tokenizers_lib.train_sentence_piece(layout)
        with open(os.path.join(directory, "tokenizer.model"), "wb") as f:
            f.write(proto)
        return sentencepiece.SentencePieceProcessor(
            model_proto=proto
        ).vocab_size()
    specials = tokenizers_lib.BPE_SPECIAL_TOKENS[layout]
    vocabulary, merges = tokenizers_lib.train_byte_pair(specials)
    if family == "gpt2":
        _write_json(directory, "vocab.json", vocabulary)
        with open(os.path.join(directory, "merges.txt"), "w") as f:
            f.write("\n".join(merges) + "\n")
        return len(vocabulary)
    added = [{"id": vocabulary[t], "content": t} for t in specials]
    _write_json(
        directory,
        "tokenizer.json",
        {
            # As `tokenizers` >= 0.20 writes them (keras-hub's Qwen3
            # converters read only this form): pairs, not "a b" strings.
            "model": {
                "vocab": vocabulary,
                "merges": [m.split(" ") for m in merges],
            },
            "added_tokens": added,
        },
    )
    if family == "llama":
        _write_json(
            directory,
            "tokenizer_config.json",
            {"bos_token": specials[0], "eos_token": specials[1]},
        )
    return len(vocabulary)


def _config(family, vocabulary_size):
    import transformers

    common = dict(
        vocab_size=vocabulary_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if family == "llama":
        return transformers.LlamaConfig(
            **common, tie_word_embeddings=False, bos_token_id=None,
            eos_token_id=None,
        )
    if family == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=True)
    if family == "mistral":
        return transformers.MistralConfig(
            **common, sliding_window=None, tie_word_embeddings=False
        )
    if family == "gemma2":
        return transformers.Gemma2Config(
            **common, head_dim=8, query_pre_attn_scalar=8,
            sliding_window=64,
        )
    if family == "gemma":
        return transformers.GemmaConfig(**common, head_dim=8)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **common, head_dim=8, query_pre_attn_scalar=8, sliding_window=64
        )
    if family == "mixtral":
        return transformers.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=None, tie_word_embeddings=False,
        )
    if family == "qwen3":
        return transformers.Qwen3Config(
            **common, head_dim=8, tie_word_embeddings=True
        )
    if family == "qwen_moe":
        # transformers writes `sliding_window: 0` while the window is off.
        return transformers.Qwen2MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=64,
        )
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **common, head_dim=8, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32,
        )
    if family == "smollm3":
        # Four layers: the published NoPE interval (every 4th layer has no
        # RoPE) reaches one.
        return transformers.SmolLM3Config(
            **dict(common, num_hidden_layers=4), no_rope_layer_interval=4,
            tie_word_embeddings=True, pad_token_id=None, bos_token_id=None,
            eos_token_id=None,
        )
    if family == "gemma4":
        # The 26B-A4B shape: global layers (the 6th) with a wider head and
        # one KV head whose keys are its values, partial RoPE; a dense FFN
        # and 4 experts (top 2) in parallel. transformers 5.19 writes the
        # global layers' shape as `per_layer_config` (keras-vllm's
        # `gemma4_hf_fixes` reads it), a text-only checkpoint no
        # `processor_config.json`.
        return transformers.Gemma4TextConfig(
            **dict(common, num_hidden_layers=6), head_dim=8,
            global_head_dim=16, num_global_key_value_heads=1,
            attention_k_eq_v=True, sliding_window=16,
            hidden_size_per_layer_input=0, enable_moe_block=True,
            num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        )
    if family == "gpt_oss":
        # Head size 64 (every preset's); experts rewritten as MXFP4 below.
        return transformers.GptOssConfig(
            **common, head_dim=64, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=16,
        )
    if family in ("qwen3_5", "qwen3_5_moe"):
        # One Gated DeltaNet and one full-attention layer; written as the
        # text model, nested under `text_config` as published below.
        linear = dict(
            head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=8,
            layer_types=["linear_attention", "full_attention"],
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
            pad_token_id=None,
        )
        if family == "qwen3_5":
            return transformers.Qwen3_5TextConfig(**common, **linear)
        return transformers.Qwen3_5MoeTextConfig(
            **common, **linear, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=32,
        )
    return transformers.GPT2Config(
        vocab_size=vocabulary_size, n_embd=32, n_layer=2, n_head=4,
        n_positions=256,
    )


def write_checkpoint(family, directory, max_shard_size=None, published=True):
    """Writes a tiny random checkpoint of `family` to `directory`.

    Args:
        family: one of `FAMILIES`.
        directory: where to write (created).
        max_shard_size: e.g. `"20KB"` to write sharded safetensors and
            their index, else one `model.safetensors`.
        published: False keeps what transformers 5 writes where the
            published checkpoints differ (GPT-OSS: unquantized experts and
            `rope_parameters`).

    Returns:
        `directory`.
    """
    import torch
    import transformers

    os.makedirs(directory, exist_ok=True)
    size = _write_tokenizer(family, directory)
    torch.manual_seed(0)
    config = _config(family, size)
    model = transformers.AutoModelForCausalLM.from_config(config)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    _write_chat_template(family, directory)
    if family == "qwen3_moe":
        # Published Qwen3-MoE configs name the expert count `num_experts`
        # (keras-hub's converter reads it); transformers 5 writes
        # `num_local_experts` instead.
        with open(os.path.join(directory, "config.json")) as f:
            written = json.load(f)
        written["num_experts"] = written["num_local_experts"]
        _write_json(directory, "config.json", written)
    if family == "gpt_oss" and published:
        hf_published.as_published_gpt_oss(directory)
    if family in ("qwen3_5", "qwen3_5_moe"):
        hf_published.as_published_qwen3_5(directory, family)
    return directory


# Families written as sharded safetensors (an index and its shards), so
# that loading through an index is covered; the rest as one file.
SHARDED = {"qwen2": "20KB"}


def cached_checkpoint(root, family):
    """`root/family`, written by `write_checkpoint` on first use (sharded
    for the families in `SHARDED`). Tests share `root` (the session's
    `hf_checkpoint_root` fixture) and copy a checkpoint before changing it."""
    directory = os.path.join(root, family)
    if not os.path.isdir(directory):
        write_checkpoint(
            family, directory, max_shard_size=SHARDED.get(family)
        )
    return directory


def changed_model(directory, every_kernel=None):
    """The checkpoint's CausalLM with its token embedding and one kernel
    moved (far enough that greedy outputs depend on the prompt), as a
    fine-tune would: a delta export stores those two.

    `every_kernel`: a noise scale that also moves every other kernel, for
    checkpoints whose greedy output stays one token otherwise (Gemma 4's).
    The class is keras-vllm's choice (`preset_causal_lm_class`): keras-hub
    picks among a backbone's CausalLM classes in no fixed order."""
    from keras_vllm.export.capabilities import preset_causal_lm_class

    causal_lm = preset_causal_lm_class(directory).from_preset(directory)
    rng = np.random.default_rng(0)
    embeddings = causal_lm.backbone.token_embedding.embeddings
    embeddings.assign(
        embeddings.numpy() + rng.normal(0, 0.5, embeddings.shape)
    )
    kernel = next(
        v for v in causal_lm.backbone.weights if len(v.shape) == 2
        and v is not embeddings
    )
    kernel.assign(kernel.numpy() + rng.normal(0, 0.1, kernel.shape))
    if every_kernel is not None:
        for variable in causal_lm.backbone.weights:
            if len(variable.shape) >= 2 and variable is not embeddings:
                variable.assign(
                    variable.numpy()
                    + rng.normal(0, every_kernel, variable.shape)
                )
    return causal_lm


# The pre-tokenizer split Llama 3 and Qwen2 checkpoints' tokenizer.json use.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def write_full_tokenizer_json(directory):
    """Rewrites the checkpoint's minimal `tokenizer.json` (vocabulary,
    merges, added tokens) as Hugging Face's `tokenizers` writes it: a
    byte-level BPE one as Llama 3 / Qwen2 have it, a SentencePiece-style
    one (byte fallback) as Gemma 4 has it; with its normalizer,
    pre-tokenizer and decoder, loadable by `tokenizers.Tokenizer.from_file`."""
    import tokenizers
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers

    path = os.path.join(directory, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        minimal = json.load(f)
    if minimal["model"].get("byte_fallback"):
        return _write_full_sentence_piece_json(minimal, path)
    tokenizer = tokenizers.Tokenizer(
        models.BPE(
            vocab=minimal["model"]["vocab"],
            merges=[tuple(m) for m in minimal["model"]["merges"]],
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(
            tokenizers.Regex(_SPLIT), behavior="isolated", invert=False
        ),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [t["content"] for t in minimal.get("added_tokens", ())]
    )
    tokenizer.save(path)


def _write_full_sentence_piece_json(minimal, path):
    """The SentencePiece-style `tokenizer.json` (Gemma 4's) as `tokenizers`
    writes it: spaces as "▁", byte-fallback pieces decoded to bytes."""
    import tokenizers
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import normalizers

    tokenizer = tokenizers.Tokenizer(
        models.BPE(
            vocab=minimal["model"]["vocab"],
            merges=[tuple(m) for m in minimal["model"]["merges"]],
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(),
        decoders.Fuse(),
    ])
    tokenizer.add_special_tokens(
        [t["content"] for t in minimal.get("added_tokens", ())]
    )
    tokenizer.save(path)
