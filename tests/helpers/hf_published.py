"""Tiny Hugging Face checkpoints in the forms the published ones have,
where transformers 5 writes another (`hf_checkpoints.write_checkpoint`
calls these).

- Gemma 4's tokenizer is a `tokenizer.json` holding a SentencePiece-derived
  BPE model (keras-hub's converter rebuilds a SentencePiece proto from it).
- GPT-OSS is published with MXFP4 experts and YaRN in `rope_scaling`.
- Qwen 3.5 and Qwen 3.5 MoE are published as image-text models: the text
  model's config under `text_config` of a `qwen3_5` / `qwen3_5_moe` config,
  its weights under `model.language_model.` (the only form keras-hub's
  converters read). The fixtures leave the vision tower out.
"""

import json
import os

import numpy as np

from keras_vllm.testing import tokenizers as tokenizers_lib


def _write_json(directory, name, value):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        json.dump(value, f)


def write_sentence_piece_json(layout, directory):
    """Writes a SentencePiece BPE model as Gemma 4's `tokenizer.json` has
    it (what keras-hub's Gemma 4 converter reads): its pieces as the BPE
    vocabulary (with "▁" for spaces and byte-fallback pieces), merges
    ranked as the pieces' scores are, and the control and user-defined
    pieces as added tokens. Returns the vocabulary size."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizers_lib.train_sentence_piece(layout))
    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    vocabulary = {p.piece: i for i, p in enumerate(proto.pieces)}
    merges = []
    for i, p in enumerate(proto.pieces):
        if p.type != kinds.NORMAL or len(p.piece) < 2:
            continue
        # A split into parts that exist before this piece (single
        # characters, or pieces of a higher score): what SentencePiece
        # merged, so that the merges' ranks reach every piece.
        for k in range(1, len(p.piece)):
            parts = (p.piece[:k], p.piece[k:])
            if all(
                part in vocabulary
                and (len(part) == 1 or vocabulary[part] < i)
                for part in parts
            ):
                merges.append(list(parts))
                break
    added = [
        {"id": i, "content": p.piece, "special": True}
        for i, p in enumerate(proto.pieces)
        if p.type in (kinds.CONTROL, kinds.USER_DEFINED)
    ]
    _write_json(
        directory,
        "tokenizer.json",
        {
            "model": {
                "type": "BPE", "vocab": vocabulary, "merges": merges,
                "byte_fallback": True,
            },
            "added_tokens": added,
        },
    )
    return len(vocabulary)


def _mxfp4(rng, experts, rows, columns):
    """Random MXFP4 weights as the GPT-OSS checkpoints store them: `blocks`
    `[E, rows, columns / 32, 16]` (two E2M1 values a byte, low nibble
    first) and E8M0 `scales` `[E, rows, columns / 32]` (bias 127)."""
    groups = columns // 32
    blocks = rng.integers(0, 256, (experts, rows, groups, 16), dtype=np.uint8)
    scales = rng.integers(122, 126, (experts, rows, groups), dtype=np.uint8)
    return blocks, scales


def as_published_gpt_oss(directory):
    """Rewrites a transformers 5 GPT-OSS checkpoint as openai/gpt-oss-20b
    is published: expert weights in MXFP4 (`*_blocks`, `*_scales`; keras-hub
    reads no other form), YaRN in `rope_scaling` and `rope_theta` at the
    top level (transformers 5 writes `rope_parameters`), and the
    `quantization_config` naming MXFP4."""
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    rng = np.random.default_rng(0)
    for name in [n for n in tensors if n.endswith("experts.gate_up_proj")]:
        experts, hidden, double = tensors.pop(name).shape
        down = name.replace("gate_up_proj", "down_proj")
        tensors.pop(down)
        for prefix, rows, columns in (
            (name, double, hidden), (down, hidden, double // 2)
        ):
            blocks, scales = _mxfp4(rng, experts, rows, columns)
            tensors[prefix + "_blocks"] = blocks
            tensors[prefix + "_scales"] = scales
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router",
            "model.embed_tokens", "lm_head",
        ],
    }
    _write_json(directory, "config.json", config)


def as_published_qwen3_5(directory, model_type):
    """Rewrites a transformers 5 text-only Qwen 3.5 (MoE) checkpoint as the
    published image-text checkpoints lay out their language model (no
    vision tower): `config.json` nests the text config, weight names gain
    `language_model.`. Sharded checkpoints are not handled."""
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    with open(os.path.join(directory, "config.json")) as f:
        text = json.load(f)
    _write_json(directory, "config.json", {
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if model_type.endswith("moe")
            else "Qwen3_5ForConditionalGeneration"
        ],
        "model_type": model_type,
        "text_config": text,
        "tie_word_embeddings": text["tie_word_embeddings"],
        "transformers_version": text.get("transformers_version"),
    })
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    renamed = {
        name.replace("model.", "model.language_model.", 1)
        if name.startswith("model.") else name: value
        for name, value in tensors.items()
    }
    save_file(renamed, path, metadata={"format": "pt"})
