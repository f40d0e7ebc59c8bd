"""MTP speculation: a Gemma 4 target served with its assistant drafting
(`keras_vllm/serve/worker/assistant_model.py` on tpu-inference's MTP
proposer; export and refusals without an engine:
`tests/export/test_assistant_export.py`, `test_speculation.py`).

One engine for the module: the trained `gemma4_e2b` target (shared with
the family modules' fine-tune) and a tiny assistant with a centroid head
distilled from it (~10 s), exported both, 3 drafts a step. The engine runs
in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), where the tests see
what its start hashed and what its drafter holds. About 105-130 s here:
the setup (distillation 10 s, exports, engine start) 45-60 s, the greedy
check 40-50 s (with the Keras references' and the engine's compiles),
prompt logprobs 2 s.
"""

import collections
import contextlib
import os
import types

import pytest

import keras_vllm
from helpers import engine_shapes
from helpers import serving_checks
from helpers.trained_models import trained
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.testing.assistants import fine_tune_assistant

FAMILY = "gemma4_e2b"
DRAFTS = 3


@contextlib.contextmanager
def hashed_while_loading():
    """Counts, by real path, the files hashed while an engine's runner loads
    its models (the target, then the drafter) in this process."""
    from tpu_inference.runner.tpu_runner import TPUModelRunner

    from keras_vllm.format import files

    counts = collections.Counter()
    loading = []
    hash_file, load_model = files.sha256_file, TPUModelRunner.load_model

    def counted(path, *args, **kwargs):
        if loading:
            counts[os.path.realpath(path)] += 1
        return hash_file(path, *args, **kwargs)

    def load(self, *args, **kwargs):
        loading.append(self)
        try:
            return load_model(self, *args, **kwargs)
        finally:
            loading.pop()

    with pytest.MonkeyPatch.context() as patch:
        # `sha256_files` (every artifact verification) hashes through it.
        patch.setattr(files, "sha256_file", counted)
        patch.setattr(TPUModelRunner, "load_model", load)
        yield counts


def listed_files(path):
    """The real paths of the files an artifact's manifest lists (a model's
    or an assistant's)."""
    manifest = fmt.read_json(os.path.join(path, fmt.MANIFEST_FILE))
    return {
        os.path.realpath(os.path.join(path, rel)) for rel in manifest["files"]
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    target = trained(FAMILY)
    # A centroid head, as the E2B / E4B assistants have (scoring every
    # token: `build_tiny_assistant`).
    assistant = testing.build_tiny_assistant(target, ordered_embeddings=True)
    fine_tune_assistant(assistant, target, steps=600)
    root = tmp_path_factory.mktemp("mtp")
    target_path = target.export_vllm(
        root / "target", max_sequence_length=256,
        golden_prompts=testing.prompts()[:2],
    )
    assistant_path = keras_vllm.export_assistant(
        assistant, root / "assistant", target=target_path
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        with hashed_while_loading() as hashed:
            engine = keras_vllm.KerasVllmEngine.from_export(
                target_path,
                **engine_shapes.ENGINE_KWARGS,
                speculative_config={
                    "method": "mtp",
                    "model": str(assistant_path),
                    "num_speculative_tokens": DRAFTS,
                },
                per_request_spec_decode_metrics="summary",
            )
        yield types.SimpleNamespace(
            target=target, engine=engine, hashed=dict(hashed),
            files=listed_files(target_path) | listed_files(assistant_path),
        )
        serving_checks.shutdown(engine)


def test_engine_start_hashes_each_file_once(served):
    """The drafter shares the served model's verified artifact: loading
    both models hashes every file of the target and of the assistant once
    (the front end's own check before vLLM starts and each tokenizer load
    verify what they read, by design; they are not counted). Before, the
    drafter opened and built the target again: every target file twice.
    ~0 s (counted during the fixture's engine start)."""
    assert served.hashed == dict.fromkeys(served.files, 1)


def _drafter_arrays(worker):
    """Whether each variable of the served token embedding is, as the very
    same array, in the target's and in the drafter's step arguments."""
    runner = worker.model_runner
    served = runner.model.backbone.token_embedding.variables
    target = {id(leaf) for leaf in runner.state_leaves}
    drafter = {id(leaf) for leaf in runner.drafter.state_leaves}
    return [
        (id(v.value) in target, id(v.value) in drafter) for v in served
    ]


def test_drafter_embeds_with_the_served_arrays(served):
    """No copy of the target's embedding in the drafter (`serve/worker/
    draft_target.py`). ~0 s (a look into the worker)."""
    (arrays,) = served.engine.llm.collective_rpc(_drafter_arrays)
    assert arrays and all(t and d for t, d in arrays), arrays


def test_greedy_matches_generate_with_assistant_drafts(served):
    """The target's own tokens, with the assistant's drafts verified
    several a step: steps that rejected every draft, steps that accepted
    all 3 (the assistant's later drafts, fed its own projected state, are
    right too) and, over the batch, a measured acceptance (a third of the
    drafted tokens on this fixture when written: 140 of 420)."""
    outputs = serving_checks.check_greedy_matches_generate(
        served.engine, served.target
    )
    metrics = [o.outputs[0].spec_decode_metrics for o in outputs]
    histograms = [m.histogram for m in metrics]
    assert sum(h[0] for h in histograms) > 0, histograms
    assert sum(h[DRAFTS] for h in histograms) > 0, histograms
    accepted = sum(i * n for h in histograms for i, n in enumerate(h))
    drafted = sum(m.num_draft_tokens for m in metrics)
    # Shown with `pytest -s`: the figure docs/HANDOFF.md quotes.
    print(f"MTP acceptance: {accepted} of {drafted} drafted tokens, "
          f"{len(metrics)} requests, histograms {histograms}")
    assert accepted / drafted > 0.2, (accepted, drafted, histograms)


def test_prompt_logprobs_match_forward_pass(served):
    serving_checks.check_prompt_logprobs(served.engine, served.target)


def _drafter_leaves(worker):
    return list(worker.model_runner.drafter.state_leaves)


# Last in the module: it shuts the module's engine down. ~1 s.
def test_shutdown_frees_the_drafters_arrays(served):
    """An in-process engine's shutdown deletes its drafter's arrays too
    (`keras_vllm_release_device_memory`): on a TPU the next engine in the
    process needs that memory, whoever still references the drafter."""
    (leaves,) = served.engine.llm.collective_rpc(_drafter_leaves)
    assert leaves and not any(leaf.is_deleted() for leaf in leaves)
    served.engine.shutdown()
    assert all(leaf.is_deleted() for leaf in leaves)
