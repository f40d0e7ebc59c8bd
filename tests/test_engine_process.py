"""How the engine process starts when JAX already runs in the caller.

vLLM itself is not started here: a top-level script (no main guard) starts
JAX, then processes through the context keras-vllm hands vLLM, the way
vLLM's `CoreEngineProcManager` does. The fork server's preload is emptied
so the check runs in seconds; engine tests cover the real preload.
"""

import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import logging, multiprocessing, os, sys
    logging.basicConfig(level=logging.INFO)
    import jax.numpy as jnp
    from keras_vllm import engine_process, envs

    print("SCRIPT BODY RAN", flush=True)  # must print once: no main guard
    jnp.zeros(1).block_until_ready()  # a live JAX runtime
    assert engine_process.jax_started()
    engine_process._PRELOAD = []

    def vllm_context():  # what vLLM's get_mp_context() answers with spawn
        return multiprocessing.get_context(envs.WORKER_MULTIPROC_METHOD.raw())

    get_mp_context = engine_process._fork_server_context(vllm_context)

    def start(name):
        context = get_mp_context()
        queue = context.SimpleQueue()
        with engine_process.skips_main():
            process = context.Process(
                target=engine_process_probe, args=(queue, name))
            process.start()
        process.join(60)
        return type(context).__name__, process.exitcode, queue.get()

    from probe import engine_process_probe

    os.environ["PROBE"] = "first"
    print("CONTEXT", *start("PROBE"), flush=True)
    os.environ["PROBE"] = "set after the fork server started"
    print("CONTEXT", *start("PROBE"), flush=True)
    os.environ["JAX_ENABLE_X64"] = "1"  # read when JAX is imported
    print("CONTEXT", *start("JAX_ENABLE_X64"), flush=True)
    """
)

_PROBE = textwrap.dedent(
    """
    import os

    from keras_vllm.engine_process import jax_started


    def engine_process_probe(queue, name):
        queue.put(f"{os.environ.get(name)}|jax started: {jax_started()}")
    """
)


def test_engine_processes_start_clean_with_the_callers_environment(tmp_path):
    # Earlier engines of this test process set the method in its
    # environment; the scripts start from a caller that has not.
    env = {
        k: v for k, v in os.environ.items()
        if k not in ("VLLM_WORKER_MULTIPROC_METHOD", "KERAS_VLLM_ENGINE_START")
    }
    (tmp_path / "probe.py").write_text(_PROBE)
    script = tmp_path / "unguarded.py"
    script.write_text(_SCRIPT)
    # `choose()` is what the engine calls; without a live JAX it leaves
    # vLLM's fork alone, with one it picks spawn for vLLM's checks.
    code = (
        "from keras_vllm import engine_process, envs\n"
        "engine_process.choose()\n"
        "assert envs.WORKER_MULTIPROC_METHOD.raw() is None\n"
        "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()\n"
        "engine_process._install = lambda: None\n"
        "engine_process.choose()\n"
        "print(envs.WORKER_MULTIPROC_METHOD.raw())\n"
    )
    chosen = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert chosen.stdout.split()[-1:] == ["spawn"], chosen.stderr[-3000:]

    env_script = (
        "import os; os.environ['VLLM_WORKER_MULTIPROC_METHOD'] = 'spawn'\n"
    )
    script.write_text(env_script + _SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    # The caller's script ran once: neither the fork server nor the engine
    # processes re-ran it.
    assert result.stdout.count("SCRIPT BODY RAN") == 1, log[-3000:]
    lines = [l.split(" ", 1)[1] for l in result.stdout.splitlines()
             if l.startswith("CONTEXT ")]
    # Forked from the fork server, without a JAX runtime, with the
    # environment the caller had when the process started.
    assert lines[0] == "_EngineContext 0 first|jax started: False"
    assert lines[1] == (
        "_EngineContext 0 set after the fork server started|jax started: False"
    )
    # A variable read at import time changed: spawned instead, and said so.
    assert lines[2] == "SpawnContext 0 1|jax started: False"
    assert "JAX_ENABLE_X64 changed since the engine fork server started" in log
