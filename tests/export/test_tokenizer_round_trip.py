"""The artifact's tokenizer is the model's tokenizer, whatever built it.

A Hugging Face `model_type: llama` checkpoint with a `tokenizer.json`
becomes a keras-hub `Llama3Tokenizer` whose special tokens come from the
checkpoint (TinyLlama's `<s>`/`</s>`, SmolLM's, a team's own), passed as
constructor arguments its `get_config()` does not return. The export stores
them (format 1.5, `format/tokenizer_args.py`) and refuses a tokenizer that
its stored config and assets would not rebuild. A tokenizer that pads with
one of its end tokens makes keras-hub's `generate()` stop at once; golden
outputs are recorded as if it padded with another id.
"""

import json
import os

import numpy as np
import pytest

from helpers import hf_checkpoints
from helpers import trained_models
from keras_vllm import format as fmt
from keras_vllm.hub import reference
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import UnsupportedModelError

# The Llama 3 special tokens of the fixture vocabulary, renamed to another
# checkpoint's (TinyLlama-style start/end, chat markers).
RENAMED = {
    "<|begin_of_text|>": "<s>",
    "<|end_of_text|>": "</s>",
    "<|eot_id|>": "<|im_end|>",
    "<|start_header_id|>": "<|im_start|>",
    "<|end_header_id|>": "<unk>",
}
TEXT = "<s>the cat<|im_start|> sat</s> on <|im_end|>"


def _rename_specials(directory):
    path = os.path.join(directory, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    for old, new in RENAMED.items():
        vocab[new] = vocab.pop(old)
    for token in tokenizer["added_tokens"]:
        token["content"] = RENAMED[token["content"]]
    with open(path, "w") as f:
        json.dump(tokenizer, f)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)


@pytest.fixture(scope="module")
def renamed_checkpoint(tmp_path_factory):
    import keras_hub

    directory = str(tmp_path_factory.mktemp("renamed") / "llama")
    hf_checkpoints.write_checkpoint("llama", directory)
    _rename_specials(directory)
    causal_lm = keras_hub.models.CausalLM.from_preset(directory)
    tokenizer = causal_lm.preprocessor.tokenizer
    assert type(tokenizer).__name__ == "Llama3Tokenizer"
    assert tokenizer.start_token == "<s>" and tokenizer.end_token == "</s>"
    return directory, causal_lm


def _ids(tokenizer, text):
    return [int(i) for i in np.asarray(tokenizer.tokenize(text)).reshape(-1)]


def _specials(tokenizer):
    return {
        getattr(tokenizer, a): getattr(tokenizer, f"{a}_id")
        for a in tokenizer._special_token_attrs
    }


def test_checkpoint_special_tokens_survive_export(renamed_checkpoint, tmp_path):
    from keras_vllm.load import keras_loader

    _, causal_lm = renamed_checkpoint
    original = causal_lm.preprocessor.tokenizer
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=64, golden_prompts=[]
    )
    manifest = fmt.read_manifest(out)
    assert manifest["format_version"] == list(fmt.names.FORMAT_VERSION)
    config = manifest["tokenizer"]["config"]
    assert config["bos_token"] == "<s>" and config["eos_token"] == "</s>"
    assert config["misc_special_tokens"] == sorted(
        set(RENAMED.values()) - {"<s>", "</s>"}
    )
    rebuilt = keras_loader.load_tokenizer(out)
    assert _specials(rebuilt) == _specials(original)
    assert _ids(rebuilt, TEXT) == _ids(original, TEXT)
    # The special tokens stay whole: one id each.
    assert _ids(rebuilt, "<|im_start|>") == [original.token_to_id("<|im_start|>")]
    assert manifest["stop_token_ids"] == [original.end_token_id]


def test_llama3_tokens_are_stored_as_before():
    causal_lm = trained_models.trained("llama3")
    tokenizer = causal_lm.preprocessor.tokenizer
    config = tokenizer.get_config()
    assert fmt.tokenizer_args.completed_config(tokenizer, config) == config


def test_a_tokenizer_that_would_not_rebuild_is_refused(
    renamed_checkpoint, tmp_path, monkeypatch
):
    _, causal_lm = renamed_checkpoint
    # As if keras-vllm did not know Llama3Tokenizer's extra arguments.
    monkeypatch.setattr(fmt.tokenizer_args, "EXTRA_ARGUMENTS", {})
    target = tmp_path / "out"
    with pytest.raises(UnsupportedModelError, match="does not rebuild"):
        causal_lm.export_vllm(str(target), golden_prompts=[])
    assert not target.exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "field, value",
    [
        ("misc_special_tokens", "<s>"),
        ("misc_special_tokens", [3]),
        ("misc_special_tokens", ["x" * 300]),
        ("misc_special_tokens", ["<s>"] * 5000),
        ("bos_token", ["<s>"]),
        ("eos_token", ""),
    ],
)
def test_hostile_extra_arguments_are_refused(field, value):
    config = {"bos_token": "<s>", "misc_special_tokens": ["<unk>"]}
    config[field] = value
    with pytest.raises(ArtifactError, match=field):
        fmt.tokenizer_args.constructor_config("Llama3Tokenizer", config)


def test_constructor_config_restores_the_token_set():
    config = {"misc_special_tokens": ["<a>", "<b>"], "name": "t"}
    restored = fmt.tokenizer_args.constructor_config("Llama3Tokenizer", config)
    assert restored == {"misc_special_tokens": {"<a>", "<b>"}, "name": "t"}
    assert config["misc_special_tokens"] == ["<a>", "<b>"]  # not changed
    assert fmt.tokenizer_args.constructor_config("GPT2Tokenizer", config) is config


def test_golden_outputs_of_a_model_that_pads_with_its_end_token():
    causal_lm = trained_models.trained("gpt2")
    tokenizer = causal_lm.preprocessor.tokenizer
    ids = reference.prompt_token_ids(causal_lm, "the cat sat on")
    free = reference.greedy_batch(causal_lm, [ids], 12, [])[0]
    # keras-hub pads with 0; make 0 an end token (where the model never
    # produces it, so the output must not change).
    assert 0 not in free and tokenizer.pad_token_id == 0
    assert reference.pads_with_stop_token(tokenizer, [0])
    assert not reference.pads_with_stop_token(tokenizer, [tokenizer.end_token_id])
    assert reference.greedy_batch(causal_lm, [ids], 12, [0])[0] == free
