"""Delta exports against Hugging Face-format presets (local transformers
checkpoints, which keras-hub converts on load).

For each family keras-hub converts and keras-vllm serves (a tiny checkpoint
written with `transformers`): `CausalLM.from_preset(dir)`, some weights
changed, the default `export_vllm(out)` stores a delta pinning the
checkpoint's files, `load_causal_lm(out)` generates what the model
generates, the `preset=` override loads from a copy, and an edited
safetensors byte is refused.
One family (Llama) is also served through the engine (one engine start).
"""

import json
import os
import shutil

import numpy as np
import pytest

from helpers import hf_checkpoints
from keras_vllm import format as fmt
from keras_vllm import reference
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError

PROMPT = "the cat sat on"
NEW_TOKENS = 12
# Qwen2 is written sharded (an index and its shards), the rest as one file.
SHARDED = {"qwen2": "20KB"}


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory):
    return tmp_path_factory.mktemp("hf_checkpoints")


def _checkpoint(root, family):
    directory = os.path.join(root, family)
    if not os.path.isdir(directory):
        hf_checkpoints.write_checkpoint(
            family, directory, max_shard_size=SHARDED.get(family)
        )
    return directory


def _changed_model(directory):
    """The checkpoint's CausalLM with its token embedding and one kernel
    moved (far enough that greedy outputs depend on the prompt)."""
    import keras_hub

    causal_lm = keras_hub.models.CausalLM.from_preset(directory)
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
    return causal_lm


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
    from keras_vllm.load.vllm_tokenizer import chat

    return chat.read_template(artifact)


def test_the_checkpoint_chat_template_serves_chat(checkpoint_root, tmp_path):
    """The stored template renders chats through the artifact's tokenizer
    (what `/v1/chat/completions` uses); `chat_template=False` stores none
    and a caller's template wins."""
    import keras_hub

    from keras_vllm.load.vllm_tokenizer import KerasVllmTokenizer

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


@pytest.mark.parametrize("family", hf_checkpoints.FAMILIES)
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
    if family in SHARDED:
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


@pytest.mark.serving
def test_engine_serves_delta_on_hf_checkpoint(checkpoint_root, tmp_path):
    """One engine start (vLLM's default multiprocess mode) on a delta
    artifact over a Llama checkpoint: token-exact against `generate()`."""
    pytest.importorskip("tpu_inference")
    from vllm import SamplingParams

    import keras_vllm
    from helpers import engine_shapes
    from helpers import serving_checks

    causal_lm = _changed_model(_checkpoint(checkpoint_root, "llama"))
    out = causal_lm.export_vllm(
        str(tmp_path / "out"), max_sequence_length=256, golden_prompts=[]
    )
    assert fmt.read_manifest(out)["weights"]["mode"] == "delta"
    prompts = serving_checks.serving_prompts()[:3]
    want = reference.greedy_batch(
        causal_lm,
        [reference.prompt_token_ids(causal_lm, text) for text in prompts],
        16,
        [],
    )
    assert len({tuple(w) for w in want}) > 1, "outputs ignore the prompt"
    engine = keras_vllm.KerasVllmEngine.from_export(
        out, **engine_shapes.ENGINE_KWARGS
    )
    try:
        outputs = engine.generate(
            list(prompts),
            SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        )
        assert [list(o.outputs[0].token_ids) for o in outputs] == want
    finally:
        serving_checks.shutdown(engine)


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
