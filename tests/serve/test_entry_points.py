"""The whole handoff in one process, started the ways users start it.

The same user code fine-tunes a tiny model, exports it, starts the real
engine (vLLM's default multiprocess mode and async scheduling) and
generates, from four entry points (the script twice), each a fresh
subprocess of this interpreter with this test's environment:

- a plain top-level script (no `if __name__ == "__main__":` guard), once
  with `from_export` and once with a plain `vllm.LLM(artifact)`;
- `python -c`;
- a test function of the user's own pytest session (none of this
  repository's conftest or pytest settings; this suite's engine tests
  also run in pytest workers, but with those);
- a Jupyter notebook kernel (ipykernel), as two cells: fine-tune and
  export, then serve, the way notebook users split them.

The served tokens must equal `generate()`'s, and the user's code must run
exactly once (a process start that re-ran the caller's `__main__` would
run it again, or die in multiprocessing's bootstrapping check).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tpu_inference")

# The user's code, split where a notebook user splits it: fine-tune and
# export (and keep the Keras reference tokens), then serve. `ARTIFACT` is
# written into the source (`_handoff`), as a user writes a path: argv is
# not the user's in a kernel or under pytest.
_TRAIN = textwrap.dedent(
    """
    import keras_vllm
    from keras_vllm import testing
    from keras_vllm.hub import reference
    from vllm import SamplingParams

    print("SCRIPT BODY RAN", flush=True)
    causal_lm = testing.build_tiny_causal_lm("gpt2")
    testing.fine_tune(causal_lm, steps=20)
    path = causal_lm.export_vllm(ARTIFACT, golden_prompts=[])
    prompts = testing.prompts()[:4]
    ids = [reference.prompt_token_ids(causal_lm, p) for p in prompts]
    want = reference.greedy_batch(causal_lm, ids, 12, [])
    """
)
_SERVE = textwrap.dedent(
    """
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, max_num_seqs=8, max_num_batched_tokens=128
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params)]
    engine.shutdown()
    assert len({tuple(w) for w in want}) > 1, want
    print("EXACT" if got == want else f"MISMATCH {got} != {want}", flush=True)
    """
)

# The serving cell as a vLLM user writes it: plain `vllm.LLM` on the
# artifact (keras-vllm's plugin, not `from_export`, sees that this process
# runs JAX).
_SERVE_PLAIN_VLLM = textwrap.dedent(
    """
    from vllm import LLM

    llm = LLM(model=path, max_num_seqs=8, max_num_batched_tokens=128)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": i} for i in ids], params)
    got = [list(o.outputs[0].token_ids) for o in outputs]
    assert len({tuple(w) for w in want}) > 1, want
    print("EXACT" if got == want else f"MISMATCH {got} != {want}", flush=True)
    """
)

# The user's own test file: its one test runs the handoff. The first check
# makes sure the session is a user's, not this suite's (whose conftest sets
# the Keras backend and the engines' environment).
_PYTEST_HEADER = textwrap.dedent(
    """
    def test_handoff(pytestconfig):
        plugins = pytestconfig.pluginmanager.get_plugins()
        files = [str(getattr(p, "__file__", "")) for p in plugins]
        assert not [f for f in files if f.endswith("conftest.py")], files
    """
)

# Generous: a kernel cell fine-tunes, or starts an engine, which takes
# minutes on a small shared CPU host.
_TIMEOUT_S = 900


def _handoff(tmp_path):
    """The handoff's cells, its artifact directory written into the first."""
    artifact = str(tmp_path / "artifact")
    return [f"ARTIFACT = {artifact!r}\n" + _TRAIN, _SERVE]


def _environment():
    # A user's fresh shell: nothing an earlier engine of this test worker
    # set in its environment.
    drop = ("VLLM_WORKER_MULTIPROC_METHOD", "KERAS_VLLM_ENGINE_START")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(argv, tmp_path):
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=_TIMEOUT_S,
        cwd=tmp_path, env=_environment(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-5000:]
    return result.stdout, result.stderr


def _script(tmp_path, serve=None):
    cells = _handoff(tmp_path)
    if serve is not None:
        cells[-1] = serve
    script = tmp_path / "handoff.py"
    script.write_text("".join(cells))
    return _run([sys.executable, str(script)], tmp_path)


def _script_plain_vllm(tmp_path):
    return _script(tmp_path, serve=_SERVE_PLAIN_VLLM)


def _python_c(tmp_path):
    return _run([sys.executable, "-c", "".join(_handoff(tmp_path))], tmp_path)


def _pytest(tmp_path):
    test_file = tmp_path / "test_user_handoff.py"
    body = textwrap.indent("".join(_handoff(tmp_path)), "    ")
    test_file.write_text(_PYTEST_HEADER + body)
    # No ini file (`-c`: this repository's pyproject `addopts` and markers),
    # no conftest above the user's directory (`--confcutdir`), whatever
    # directory pytest's temporary paths are under; `-s`: the prints (and
    # the engine's output) reach stdout as they do for a user who asks.
    return _run(
        [
            sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
            "-c", os.devnull, "--rootdir", str(tmp_path),
            "--confcutdir", str(tmp_path), str(test_file),
        ],
        tmp_path,
    )


def _notebook_kernel(tmp_path):
    # Part of the test extra: a missing one fails here, it does not skip.
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    # A kernel spec of this interpreter: an installed "python3" spec may
    # name another one.
    spec_dir = tmp_path / "kernels" / "handoff"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "handoff", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    manager = KernelManager(
        kernel_name="handoff",
        kernel_spec_manager=KernelSpecManager(
            kernel_dirs=[str(tmp_path / "kernels")]
        ),
    )
    streams = {"stdout": [], "stderr": []}

    def collect(message):
        # ipykernel forwards its processes' file descriptors 1 and 2 too,
        # so the engine processes' output arrives here as well.
        content = message["content"]
        if message["msg_type"] == "stream":
            streams[content["name"]].append(content["text"])
        elif message["msg_type"] == "error":
            streams["stderr"].append("\n".join(content["traceback"]))

    manager.start_kernel(env=_environment(), cwd=str(tmp_path))
    client = manager.client()
    try:
        client.start_channels()
        client.wait_for_ready(timeout=300)
        for cell in _handoff(tmp_path):
            reply = client.execute_interactive(
                cell, timeout=_TIMEOUT_S, output_hook=collect,
                allow_stdin=False,
            )
            assert reply["content"]["status"] == "ok", (
                "".join(streams["stdout"])[-2000:]
                + "".join(streams["stderr"])[-5000:]
            )
    finally:
        client.stop_channels()
        manager.shutdown_kernel()
    return "".join(streams["stdout"]), "".join(streams["stderr"])


_ENTRY_POINTS = {
    "unguarded script": _script,
    # Without the plugin's check, vLLM forks this JAX process: it hangs.
    "unguarded script, plain vllm.LLM": _script_plain_vllm,
    "python -c": _python_c,
    "pytest": _pytest,
    "notebook kernel": _notebook_kernel,
}


# Each entry point is a fresh interpreter that imports vLLM, fine-tunes,
# exports and starts an engine: 1-3 minutes of CI on 2 cores. The CI tier
# runs a script through `KerasVllmEngine` and a notebook kernel; plain
# `vllm.LLM` from a script (the same plugin check, reached from vLLM's side),
# `python -c` and a user's pytest session start the engine as the script
# does (a `__main__` without a file, another `__main__` module) and are in
# `-m matrix`.
MATRIX_ONLY = ("unguarded script, plain vllm.LLM", "python -c", "pytest")


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(
            entry, marks=pytest.mark.matrix if entry in MATRIX_ONLY else ()
        )
        for entry in _ENTRY_POINTS
    ],
)
def test_one_process_handoff_serves_exactly(entry, tmp_path):
    out, err = _ENTRY_POINTS[entry](tmp_path)
    assert out.count("SCRIPT BODY RAN") == 1, out
    assert "EXACT" in out, out[-2000:]
    assert "bootstrapping phase" not in err
