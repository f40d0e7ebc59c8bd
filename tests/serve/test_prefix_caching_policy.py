"""Artifacts whose attention keys depend on the prompt's length (Phi-3's
"su" RoPE: keys are rotated with the factors for how long the request's
prompt is) are served without vLLM's prefix caching: a
block cached by a short request would hand a longer prompt keys Keras
never computes for it (seen: greedy tokens changed after earlier requests
had cached a shared prefix).

Export records it (`manifest.prefix_caching`, format 1.8); every entry point
turns prefix caching off for such an artifact, refuses to turn it on, and
the worker refuses an older artifact that says nothing about it.
"""

import os
import shutil
import subprocess
import sys

import pytest

import keras_vllm
from helpers import hostile_edits
from helpers.trained_models import trained
from keras_vllm import format as fmt
from keras_vllm.errors import KerasVllmError
from keras_vllm.errors import ServingError
from keras_vllm.serve import preflight
from keras_vllm.serve.frontend import refusals


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix_caching")
    su = keras_vllm.export_vllm(trained("phi3"), str(root / "su"), golden_prompts=())
    plain = keras_vllm.export_vllm(
        trained("gpt2"), str(root / "plain"), golden_prompts=()
    )
    # What a 1.7 export of the same model looked like: no field.
    older = str(root / "older")
    shutil.copytree(su, older)
    hostile_edits.edit(older, _as_format_1_7)
    return {"su": su, "plain": plain, "older": older}


def test_export_records_whether_blocks_may_be_reused(artifacts):
    assert fmt.open_artifact(artifacts["su"]).manifest["prefix_caching"] is False
    assert fmt.open_artifact(artifacts["plain"]).manifest["prefix_caching"] is True


def test_the_engine_settings_turn_it_off_and_refuse_turning_it_on(artifacts):
    plan = preflight.check(artifacts["su"])
    assert plan.engine_kwargs["enable_prefix_caching"] is False
    with pytest.raises(ServingError, match="--no-enable-prefix-caching"):
        preflight.check(artifacts["su"], {"enable_prefix_caching": True})
    # Other artifacts keep vLLM's own default.
    assert "enable_prefix_caching" not in preflight.check(
        artifacts["plain"]
    ).engine_kwargs


def test_plain_vllm_serve_names_the_switch(artifacts):
    path = artifacts["su"]
    message = refusals.refusal(path, ["vllm", "serve", path])
    assert "prefix caching" in message and "--no-enable-prefix-caching" in message
    assert refusals.refusal(
        path, ["vllm", "serve", path, "--no-enable-prefix-caching"]
    ) is None
    assert "--no-enable-prefix-caching" in refusals.refusal(
        path, ["vllm", "serve", path, "--enable-prefix-caching"]
    )
    plain = artifacts["plain"]
    assert refusals.refusal(plain, ["vllm", "serve", plain]) is None


def test_keras_vllm_serve_passes_the_switch(artifacts):
    from keras_vllm.cli.serve import serve_command

    assert "--no-enable-prefix-caching" in serve_command(artifacts["su"], [])
    assert "--no-enable-prefix-caching" not in serve_command(
        artifacts["plain"], []
    )


def test_an_older_artifact_says_nothing_and_the_worker_refuses(artifacts):
    """A 1.7 artifact has no field: the engine starts with vLLM's prefix
    caching, and the worker, which builds the paged layers, refuses it
    (vLLM reports the engine's failure and logs the worker's reason; a
    user's script, run as a user runs it, shows both)."""
    manifest = fmt.open_artifact(artifacts["older"]).manifest
    assert fmt.prefix_caching(manifest) is True
    script = (
        "import keras_vllm\n"
        "if __name__ == '__main__':\n"
        f"    keras_vllm.KerasVllmEngine.from_export({artifacts['older']!r}, "
        "max_num_seqs=8, max_num_batched_tokens=64)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        timeout=600,
    )
    assert run.returncode != 0
    assert "ServingError" in run.stderr
    assert "--no-enable-prefix-caching" in run.stderr


def test_the_field_is_checked(artifacts, tmp_path):
    bad = str(tmp_path / "bad")
    shutil.copytree(artifacts["plain"], bad)
    hostile_edits.edit(bad, lambda m: m.update(prefix_caching="no"))
    with pytest.raises(KerasVllmError, match="prefix_caching"):
        fmt.open_artifact(bad)
    hostile_edits.edit(
        bad, lambda m: m.update(prefix_caching=False, format_version=[1, 7])
    )
    with pytest.raises(KerasVllmError, match="format 1.8 field"):
        fmt.open_artifact(bad)
    assert os.path.isdir(bad)


def _as_format_1_7(manifest):
    del manifest["prefix_caching"]
    manifest["format_version"] = [1, 7]
