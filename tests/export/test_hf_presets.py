"""Delta exports against Hugging Face-format presets (local transformers
checkpoints, which keras-hub converts on load).

For each family keras-hub converts and keras-vllm serves (a tiny checkpoint
written with `transformers`): `CausalLM.from_preset(dir)`, some weights
changed, the default `export_vllm(out)` stores a delta pinning the
checkpoint's files, `load_causal_lm(out)` generates what the model
generates, the `preset=` override loads from a copy, and an edited
safetensors byte is refused.
Serving each family's delta through the engine: test_hf_presets_serving.py.
"""

import json
import os
import shutil

import numpy as np
import pytest

from helpers import hf_checkpoints
from keras_vllm import format as fmt
from keras_vllm.hub import reference
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError

PROMPT = "the cat sat on"
NEW_TOKENS = 12


@pytest.fixture
def checkpoint_root(hf_checkpoint_root):
    # The session's checkpoints (Qwen2's sharded: an index and its shards).
    return hf_checkpoint_root


_checkpoint = hf_checkpoints.cached_checkpoint


_changed_model = hf_checkpoints.changed_model


def _greedy(causal_lm):
    return reference.greedy_continuation(
        causal_lm, reference.prompt_token_ids(causal_lm, PROMPT), NEW_TOKENS, []
    )


def _same_weights(a, b):
    """Every backbone variable bit-equal, by position."""
    return len(a.backbone.weights) == len(b.backbone.weights) and all(
        np.array_equal(x.numpy(), y.numpy())
        for x, y in zip(a.backbone.weights, b.backbone.weights)
    )


def _expected_pins(directory):
    names = {"config.json"}
    index = os.path.join(directory, fmt.HF_SHARDED_INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            names |= {fmt.HF_SHARDED_INDEX_FILE} | set(
                json.load(f)["weight_map"].values()
            )
    else:
        names.add(fmt.HF_WEIGHTS_FILE)
    return {n: fmt.sha256_file(os.path.join(directory, n)) for n in names}


def _stored_template(artifact):
    from keras_vllm.serve.tokenizer import chat

    return chat.read_template(artifact)


def test_the_checkpoint_chat_template_serves_chat(checkpoint_root, tmp_path):
    """The stored template renders chats through the artifact's tokenizer
    (what `/v1/chat/completions` uses); `chat_template=False` stores none
    and a caller's template wins."""
    import keras_hub

    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    directory = _checkpoint(checkpoint_root, "llama")
    causal_lm = keras_hub.models.CausalLM.from_preset(directory)
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=64, golden_prompts=[]
    )
    tokenizer = KerasVllmTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": " hi there "}]
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert text == f"{tokenizer.bos_token}[user] hi there\n[assistant]"
    none = causal_lm.export_vllm(
        str(tmp_path / "none"), max_sequence_length=64, golden_prompts=[],
        chat_template=False,
    )
    assert _stored_template(none) is None
    own = causal_lm.export_vllm(
        str(tmp_path / "own"), max_sequence_length=64, golden_prompts=[],
        chat_template="{{ messages[0]['content'] }}",
    )
    assert _stored_template(own) == "{{ messages[0]['content'] }}"


# A delta export over each family's converted checkpoint, reloaded and
# decoded (~10 s a family): in the CI tier for the families whose
# conversion keras-vllm corrects (`keras_vllm/layers/*_hf_fixes.py`) and for
# one of each other kind (dense Llama, Mistral's window, Qwen 3's QK norms,
# hybrid Qwen 3.5); the others in `-m matrix`.
DELTA_IN_CI = (
    "llama", "mistral", "qwen3", "gpt_oss", "qwen3_5", "gemma4", "smollm3",
)


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(
            family, marks=() if family in DELTA_IN_CI else pytest.mark.matrix
        )
        for family in hf_checkpoints.FAMILIES
    ],
)
def test_delta_export_from_hf_checkpoint(family, checkpoint_root, tmp_path):
    import keras_vllm

    directory = _checkpoint(checkpoint_root, family)
    causal_lm = _changed_model(directory)
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=64, golden_prompts=[]
    )
    manifest = fmt.read_manifest(out)
    assert manifest["weights"]["mode"] == "delta"
    stored = len(manifest["weights"]["variables"])
    assert 0 < stored < len(causal_lm.backbone.weights)
    assert manifest["preset"]["handle"] == os.path.abspath(directory)
    pins = _expected_pins(directory)
    assert manifest["preset"]["files"] == pins
    if family in hf_checkpoints.SHARDED:
        assert len(pins) > 3, "the checkpoint was not written sharded"

    loaded = keras_vllm.load_causal_lm(out, verbose=False)
    assert _same_weights(loaded, causal_lm)
    assert _greedy(loaded) == _greedy(causal_lm)

    # An instruction-tuned checkpoint's chat template comes along.
    assert _stored_template(out) == hf_checkpoints.CHAT_TEMPLATES.get(family)

    # The offline-host story: a copy of the checkpoint, passed as preset=
    # (built for one family: the check is the same for all).
    copy = str(tmp_path / "copied_checkpoint")
    shutil.copytree(directory, copy)
    if family == "llama":
        loaded = keras_vllm.load_causal_lm(out, preset=copy, verbose=False)
        assert _same_weights(loaded, causal_lm)

    # One byte of one pinned weight file changed: refused, naming it.
    weight_file = sorted(n for n in pins if n.endswith(".safetensors"))[-1]
    path = os.path.join(copy, weight_file)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 1)
        last = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(IntegrityError, match=weight_file) as refused:
        keras_vllm.load_causal_lm(out, preset=copy, verbose=False)
    assert "weights='full'" in str(refused.value)


# ~1 minute of CI (quantizing a converted checkpoint); in `-m matrix`.
@pytest.mark.matrix
def test_int8_export_over_a_checkpoint_is_stored_full(
    checkpoint_root, tmp_path
):
    """Fine-tuned, then quantized to int8: every variable differs from the
    float checkpoint, so `weights="auto"` stores them all as a full export
    that pins nothing (a delta would store the same and still need the
    checkpoint on every serving host)."""
    import keras_hub

    import keras_vllm

    directory = str(tmp_path / "checkpoint")
    shutil.copytree(_checkpoint(checkpoint_root, "llama"), directory)
    causal_lm = keras_hub.models.CausalLM.from_preset(directory)
    for variable in causal_lm.backbone.weights:  # as a full fine-tune moves
        variable.assign(variable.numpy() * 1.01)
    causal_lm.backbone.quantize("int8")
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=64,
        golden_prompts=["the cat"], golden_max_new_tokens=4,
    )
    manifest = fmt.read_manifest(out)
    weights = manifest["weights"]
    assert weights["mode"] == "full"
    assert len(weights["variables"]) == weights["total_variables"]
    assert manifest["preset"] == {
        "handle": os.path.abspath(directory), "files": {}
    }
    shutil.rmtree(directory)  # the serving host has no checkpoint
    loaded = keras_vllm.load_causal_lm(out, verbose=False)
    assert _greedy(loaded) == _greedy(causal_lm)


def test_export_after_the_checkpoint_moved_says_how_to_export(
    checkpoint_root, tmp_path
):
    from keras_vllm.errors import PresetUnavailableError

    copy = str(tmp_path / "checkpoint")
    shutil.copytree(_checkpoint(checkpoint_root, "llama"), copy)
    causal_lm = _changed_model(copy)
    shutil.move(copy, str(tmp_path / "moved"))
    with pytest.raises(PresetUnavailableError) as refused:
        causal_lm.export_vllm(str(tmp_path / "out"), golden_prompts=[])
    message = str(refused.value)
    assert "this model was loaded from" in message
    assert "export_vllm(path, preset=" in message
    assert "weights='full'" in message
    assert "load_causal_lm" not in message  # not the serving side's advice
    assert not (tmp_path / "out").exists()
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), preset=str(tmp_path / "moved"),
        golden_prompts=[],
    )
    manifest = fmt.read_manifest(out)
    assert manifest["weights"]["mode"] == "delta"
    # No length asked for: the checkpoint's own limit, not 2048 positions
    # its rotary model never trained at.
    assert manifest["max_sequence_length"] == 256


@pytest.mark.parametrize("family", hf_checkpoints.FAMILIES)
def test_converted_tokenizers_agree_with_the_checkpoint(
    family, checkpoint_root, tmp_path
):
    """No warning where keras-hub converts the checkpoint's tokenizer
    faithfully (checked against its `tokenizer.json` where it has one)."""

    from keras_vllm.export import checkpoint_tokenizer
    from keras_vllm.export.capabilities import preset_causal_lm_class

    import tokenizers

    directory = _checkpoint(checkpoint_root, family)
    path = os.path.join(directory, "tokenizer.json")
    if os.path.exists(path):
        # As `tokenizers` writes it (the fixture's is a minimal one).
        copy = str(tmp_path / family)
        shutil.copytree(directory, copy)
        hf_checkpoints.write_full_tokenizer_json(copy)
        directory, path = copy, os.path.join(copy, "tokenizer.json")
    # keras-hub picks among a backbone's CausalLM classes in no fixed order
    # (Gemma 4's assistant, which this checkpoint is not, among them).
    tokenizer = preset_causal_lm_class(
        directory
    ).from_preset(directory).preprocessor.tokenizer
    assert checkpoint_tokenizer.warn_if_converted_differently(
        tokenizer, directory
    ) is None
    if os.path.exists(path):  # compared, not skipped
        assert checkpoint_tokenizer.first_difference(
            tokenizer, tokenizers.Tokenizer.from_file(path)
        ) is None


def test_a_llama_2_style_tokenizer_json_is_warned_about(
    checkpoint_root, tmp_path, caplog
):
    """keras-hub 0.32 reads a Llama 2 / TinyLlama `tokenizer.json`
    (SentencePiece pieces) as a byte-level Llama 3 tokenizer that drops
    spaces; the export says so."""
    import transformers

    directory = str(tmp_path / "llama2")
    shutil.copytree(_checkpoint(checkpoint_root, "mistral"), directory)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    # As transformers writes a SentencePiece Llama tokenizer.
    transformers.LlamaTokenizer.from_pretrained(directory).save_pretrained(
        directory
    )
    causal_lm = _changed_model(directory)
    with caplog.at_level("WARNING", logger="keras_vllm"):
        causal_lm.export_vllm(
            str(tmp_path / "out"), max_sequence_length=64, golden_prompts=[]
        )
    warned = [r.getMessage() for r in caplog.records
              if "checkpoint's own tokenizer.json" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert "'the cat sat on the mat'" in warned[0]


def test_hf_index_naming_unpinned_shard_is_refused(checkpoint_root, tmp_path):
    """A sharded checkpoint whose index now names another shard loads
    through a file the artifact does not pin: refused before any weight is
    read."""
    import keras_vllm

    directory = _checkpoint(checkpoint_root, "qwen2")
    causal_lm = _changed_model(directory)
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=64, golden_prompts=[]
    )
    copy = str(tmp_path / "copied_checkpoint")
    shutil.copytree(directory, copy)
    index_path = os.path.join(copy, fmt.HF_SHARDED_INDEX_FILE)
    with open(index_path) as f:
        index = json.load(f)
    key = sorted(index["weight_map"])[0]
    shard = index["weight_map"][key]
    os.rename(os.path.join(copy, shard), os.path.join(copy, "other.safetensors"))
    index["weight_map"][key] = "other.safetensors"
    with open(index_path, "w") as f:
        json.dump(index, f)
    with pytest.raises(ArtifactError, match="names other shards than"):
        keras_vllm.load_causal_lm(out, preset=copy, verbose=False)


@pytest.mark.parametrize(
    "names, problem",
    [
        ({"config.json", "model.safetensors"}, None),
        (
            {"config.json", "model.safetensors.index.json",
             "model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors"},
            None,
        ),
        ({"model.safetensors"}, "does not pin the preset's config.json"),
        ({"config.json", "model.safetensors", "model.weights.h5"}, "mixes"),
        (
            {"config.json", "model.safetensors",
             "model.safetensors.index.json"},
            "pins both",
        ),
        (
            {"config.json", "model.safetensors.index.json"},
            "none of its shards",
        ),
        (
            {"config.json", "model.safetensors", "model-00001.safetensors"},
            "shards beside",
        ),
        ({"config.json", "tokenizer.json"}, "does not read"),
        ({"config.json", "x.safetensors.bak"}, "does not read"),
    ],
)
def test_hf_preset_pins_are_checked(names, problem):
    """A delta manifest's pins over a Hugging Face checkpoint: one format's
    config and every weight file, nothing else (plain Python)."""
    from keras_vllm.format import references

    preset = {"handle": "/models/x", "files": dict.fromkeys(names, "0" * 64)}
    if problem is None:
        references.check_preset_reference(preset, "delta")
        return
    with pytest.raises(ArtifactError, match=problem):
        references.check_preset_reference(preset, "delta")
