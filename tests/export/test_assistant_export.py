"""A Gemma 4 MTP assistant exported beside its target, Keras-side only
(`keras_vllm/export/assistant.py`, `keras_vllm/load/assistant.py`,
`keras_vllm/format/assistant.py`; served: `tests/serve/test_mtp_
speculation.py`).

About 35 s here, plus the `gemma4_e2b` fine-tune (~20 s) where no other
module of the session ran it first: one target export, two assistant
exports and `generate()` compiled twice (plain and speculative with a
centroid head).
"""

import numpy as np
import pytest

import keras_vllm
from helpers.trained_models import trained
from keras_vllm import testing
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ExportError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import ServingError
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.format import assistant as assistant_format
from keras_vllm.load.assistant import assistant_variables
from keras_vllm.serve import speculation

FAMILY = "gemma4_e2b"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The trained target's artifact and its assistant's."""
    target = trained(FAMILY)
    # A centroid head, as the E2B / E4B assistants have (its ordering and
    # router are stored too).
    assistant = testing.build_tiny_assistant(target, ordered_embeddings=True)
    root = tmp_path_factory.mktemp("mtp")
    target_path = target.export_vllm(root / "target", golden_prompts=())
    path = keras_vllm.export_assistant(
        assistant, root / "assistant", target=target_path
    )
    return target, assistant, target_path, path


def test_assistant_round_trips_and_drafts_exactly_in_keras(exported):
    target, assistant, target_path, path = exported
    manifest, config = assistant_format.read_assistant(path)
    # Bound to the target it was exported with; the neutral model type.
    assert manifest["target"]["manifest_sha256"] == (
        keras_vllm.format.manifest_hash(target_path)
    )
    assert config["model_type"] == keras_vllm.format.MODEL_TYPE
    assert config["architectures"] == [assistant_format.ASSISTANT_ARCHITECTURE]
    assert config["backbone_hidden_size"] == target.backbone.hidden_dim
    loaded = keras_vllm.load_assistant(path)
    originals = assistant_variables(assistant)
    for name, variable in assistant_variables(loaded).items():
        np.testing.assert_array_equal(
            np.asarray(variable.value), np.asarray(originals[name].value)
        )
    # keras-hub's speculative `generate()` with the loaded assistant is
    # the target's own greedy output.
    for prompt in testing.prompts()[:2]:
        plain = target.generate(prompt, max_length=28, stop_token_ids=None)
        drafted = target.generate(
            prompt, max_length=28, stop_token_ids=None,
            assistant_model=loaded,
        )
        assert drafted == plain


def test_an_altered_assistant_is_refused(exported, tmp_path):
    import shutil

    *_, path = exported
    copy = tmp_path / "assistant"
    shutil.copytree(path, copy)
    config = copy / keras_vllm.format.CONFIG_FILE
    config.write_text(config.read_text().replace('"vocab_size"', '"vocab_size" '))
    with pytest.raises(IntegrityError, match="config.json"):
        assistant_format.read_assistant(copy)


@pytest.mark.parametrize("edit, says", [
    (lambda facts: facts.clear(), "'backbone_hidden_size' must be"),
    (lambda facts: facts.update(vocab_size="384"), "'vocab_size' must be"),
    (lambda facts: facts.update(layer_types="full_attention"),
     "'layer_types' must be"),
    (lambda facts: facts["kind_caches"].popitem(), "'kind_caches' must give"),
    (lambda facts: facts.update(kind_caches=[[16, 2]]),
     "'kind_caches' must give"),
])
def test_an_altered_manifest_is_refused_by_name(exported, tmp_path, edit,
                                                says):
    # The manifest holds the files' checksums, not its own: what the fit
    # checks read from it is validated before they compare it (a KeyError
    # or TypeError deep in a serving preflight before). ~0.1 s each.
    import json
    import shutil

    *_, path = exported
    copy = tmp_path / "assistant"
    shutil.copytree(path, copy)
    manifest_file = copy / keras_vllm.format.MANIFEST_FILE
    manifest = json.loads(manifest_file.read_text())
    edit(manifest["facts"])
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=says):
        assistant_format.read_assistant(copy)


def test_an_assistant_that_does_not_fit_is_refused_by_name(exported, tmp_path):
    target, _, target_path, _ = exported
    # Its layers attend with another head size than the target's caches.
    narrow = testing.build_tiny_assistant(target, head_dim=8)
    with pytest.raises(ExportError, match="head size 8 over 2 KV heads"):
        keras_vllm.export_assistant(narrow, tmp_path / "a", target=target_path)
    with pytest.raises(UnsupportedModelError, match="no KerasHub multi-token"):
        keras_vllm.export_assistant(target, tmp_path / "b", target=target_path)


@pytest.mark.parametrize("change, says", [
    ({"backbone_hidden_size": 32}, "width 32, the target's hidden size is 64"),
    ({"vocab_size": 100}, "100 tokens, the target's 384"),
    ({"layer_types": ["chunked_attention"]},
     "'chunked_attention' layers read the target's last"),
    ({"kind_caches": {"sliding_attention": [16, 2],
                      "full_attention": [16, 2]}},
     "'full_attention' layers attend with head size 16"),
])
def test_fit_problems_name_what_differs(exported, change, says):
    target_path = exported[2]
    manifest, _ = assistant_format.read_assistant(exported[3])
    facts = dict(manifest["facts"], **change)
    config = keras_vllm.format.open_artifact(target_path).read_json(
        keras_vllm.format.CONFIG_FILE
    )
    problems = assistant_format.fit_problems(
        facts, assistant_format.target_facts(config)
    )
    assert len(problems) == 1 and says in problems[0], problems


def test_mtp_is_served_with_an_assistant_artifact_only(exported, tmp_path):
    *_, target_path, path = exported
    artifact = keras_vllm.format.open_artifact(target_path)

    def check(config):
        speculation.check(artifact, {"speculative_config": config})

    check({"method": "mtp", "model": str(path), "num_speculative_tokens": 3})
    with pytest.raises(ServingError, match="tensor_parallel_size=2"):
        speculation.check(artifact, {"tensor_parallel_size": 2,
                                     "speculative_config": {
                                         "method": "mtp", "model": str(path),
                                         "num_speculative_tokens": 3}})
    for model in (None, str(target_path), "google/gemma-4-E2B-it-assistant"):
        with pytest.raises(ServingError, match="export_assistant"):
            check({"method": "mtp", "model": model,
                   "num_speculative_tokens": 3})
    # Another target's assistant (the `gemma4` family: global layers with
    # one KV head), refused by what differs.
    other = testing.build_tiny_causal_lm("gemma4", num_layers=6)
    other_path = other.export_vllm(tmp_path / "other", golden_prompts=())
    foreign = keras_vllm.export_assistant(
        testing.build_tiny_assistant(other), tmp_path / "foreign",
        target=other_path,
    )
    with pytest.raises(ServingError, match="cannot draft for"):
        check({"method": "mtp", "model": str(foreign),
               "num_speculative_tokens": 3})


def test_an_assistant_of_the_base_drafts_for_a_fine_tune(exported, tmp_path,
                                                          caplog):
    """An assistant exported for the base model (another artifact, the
    same shape) is served with the fine-tuned target, with a log line:
    drafts only change how many tokens a step yields (engine: an untrained
    assistant, every draft rejected, output still `generate()`'s)."""
    import logging

    target, assistant, target_path, _ = exported
    base = testing.build_tiny_causal_lm(FAMILY)
    base_path = base.export_vllm(tmp_path / "base", golden_prompts=())
    for_base = keras_vllm.export_assistant(
        assistant, tmp_path / "base_assistant", target=base_path
    )
    artifact = keras_vllm.format.open_artifact(target_path)
    with caplog.at_level(logging.INFO, logger="keras_vllm"):
        speculation.check(artifact, {"speculative_config": {
            "method": "mtp", "model": str(for_base),
            "num_speculative_tokens": 3}})
    assert "exported for another target artifact" in caplog.text


def test_an_assistant_alone_is_refused_by_name(exported):
    """`from_export`, `keras-vllm serve` and `vllm serve` on the assistant's
    directory (one preflight: `serve/preflight.py`)."""
    from keras_vllm.serve import preflight

    with pytest.raises(ServingError, match="assistant artifact .* Serve the "
                       "target with speculative_config"):
        preflight.check(exported[3])
    # Every model-artifact reader (`keras-vllm inspect`, `load_causal_lm`).
    with pytest.raises(keras_vllm.ArtifactError, match="an assistant artifact"):
        keras_vllm.format.open_artifact(exported[3])
