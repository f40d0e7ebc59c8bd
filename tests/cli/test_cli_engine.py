"""The `keras-vllm` commands that start vLLM, run as a user would.

Each starts a real engine on a tiny fine-tuned model's artifact, and its
output must be readable: keras-vllm's phase lines and results, not vLLM's
start-up logs or false alarms about absent TPU hardware.
"""

import os
import re
import subprocess
import sys

import pytest
import requests

from helpers.trained_models import trained
from helpers.http_server import running_server
from helpers.http_server import terminate_while_streaming
from keras_vllm import format as fmt
from keras_vllm import testing

pytest.importorskip("vllm")
pytestmark = pytest.mark.serving

CLI = [os.path.join(os.path.dirname(sys.executable), "keras-vllm")]

# Lines that vLLM, tpu-inference or their imports print at start-up and that
# a user should not have to read (unless they pass -v).
NOISE = (
    "TPU GCE Metadata",
    "Error getting device name",
    "Failed to import from vllm._C",
    "Traceback",
    "non-default args",  # vLLM's INFO lines
    "Initializing a V1 LLM engine",
    "Precompile worker",
    # Printed outside Python logging (TensorFlow, libtpu, Gloo); stopped at
    # their source unless verbose.
    "absl::InitializeLog",
    "oneDNN custom operations",
    "cuInit",
    "TPU_WORKER_HOSTNAMES",
    "[Gloo]",
)


def _quiet(text):
    found = [line for line in text.splitlines() if any(n in line for n in NOISE)]
    assert not found, "\n".join(found[:10])


@pytest.fixture(scope="module", autouse=True)
def product_warm_up():
    """These commands warm up as they do for users (conftest's
    `compile_on_demand` skips the precompilation for other test engines)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("SKIP_JAX_PRECOMPILE", raising=False)
        yield


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    preset = str(tmp_path_factory.mktemp("cli_engine") / "tiny_gpt2")
    testing.save_tiny_preset(trained("gpt2"), preset)
    out = str(tmp_path_factory.mktemp("cli_engine_out") / "artifact")
    result = subprocess.run(
        CLI + ["export", preset, out, "--sampler", "greedy"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return out


# ~2.5 minutes of CI (its own engine process); every family engine of the
# CI tier replays its golden outputs (helpers/family_serving.py).
@pytest.mark.matrix
def test_verify_engine_replays_golden_outputs_quietly(exported):
    result = subprocess.run(
        CLI + ["verify", "-q", "--engine", exported],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "golden (keras)  ok" in result.stdout
    assert "golden (vllm)   ok" in result.stdout
    _quiet(result.stdout + result.stderr)


# ~1.5 minutes of CI (a CLI export and a server process): the CI tier runs
# `keras-vllm demo` (export, engine, generate through the command line) and
# `vllm serve` of an artifact behind the same frontend
# (tests/serve/test_vllm_serve.py); this case is in `-m matrix`.
@pytest.mark.matrix
def test_serve_answers_with_the_artifact_defaults_quietly(
    exported, tmp_path
):
    # Served from another working directory, with the preset copied where
    # an offline serving host keeps it (`--preset`, relative to there).
    import shutil

    recorded = fmt.open_artifact(exported).manifest["preset"]["handle"]
    copy = tmp_path / "models" / "tiny_gpt2"
    shutil.copytree(recorded, copy)
    log_path = tmp_path / "serve.log"
    with running_server(
        CLI + ["serve", exported, "--preset", "models/tiny_gpt2"],
        log_path,
        timeout=600,
        cwd=tmp_path,
    ) as url:
        golden = fmt.read_json(os.path.join(exported, "golden.json"))
        for record in golden["outputs"][:3]:
            # No sampling parameters: the artifact's greedy sampler and
            # stop tokens apply.
            response = requests.post(
                url + "/v1/completions",
                json={
                    "model": exported,
                    "prompt": record["prompt_ids"],
                    "max_tokens": golden["max_new_tokens"],
                    "return_token_ids": True,
                },
                timeout=120,
            )
            assert response.status_code == 200, response.text
            choice = response.json()["choices"][0]
            assert choice["token_ids"] == record["output_ids"]
        # SIGTERM while requests stream: each ends (vLLM aborts what runs),
        # none is left waiting, and the server exits.
        prompts = [record["prompt_ids"] for record in golden["outputs"]] * 12
        ends, seconds = terminate_while_streaming(
            url, exported, prompts, max_tokens=100
        )
        assert "hung" not in ends and None not in ends, ends
        assert "abort" in ends, ends  # the SIGTERM came while they ran
        assert seconds is not None and seconds < 60, ends
    text = log_path.read_text()
    # keras-vllm serve prints the vLLM command it runs.
    assert re.search(r"^\S*vllm serve ", text, re.M), text[:2000]
    assert "Application startup complete" in text
    # The engine process reports its phases, one plain line each. (The
    # checksums were verified once, by `vllm serve`'s own refusal check;
    # its forked engine process reuses that unless a file changed since.)
    assert text.count("verifying checksums") <= 1, text
    for phase in (f"loading preset '{copy}'",):
        assert re.search(
            rf"keras-vllm: {re.escape(phase)}[^\n\r]*: done in", text
        ), text
    _quiet(text)


def test_demo_runs_the_whole_handoff(tmp_path):
    result = subprocess.run(
        CLI + ["demo", "--steps", "30", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    n = len(testing.prompts())
    assert f"{n}/{n} served continuations equal" in result.stdout
    _quiet(result.stdout + result.stderr)
