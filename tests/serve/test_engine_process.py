"""How the engine process starts when JAX already runs in the caller.

vLLM itself is not started here: a top-level script (no main guard) starts
JAX, then processes through the context keras-vllm hands vLLM, the way
vLLM's `CoreEngineProcManager` does. The fork server's preload is emptied
so the check runs in seconds; engine tests cover the real preload.

A forked engine process shares its caller's (or the fork server's) memory;
its first full garbage collection must not walk the objects it inherited
(`engine_process.forks_frozen`, the preload's `gc.freeze()`).
"""

import os
import subprocess
import sys
import textwrap
from unittest import mock

_SCRIPT = textwrap.dedent(
    """
    import logging, multiprocessing, os, sys
    logging.basicConfig(level=logging.INFO)
    import jax.numpy as jnp
    from keras_vllm import envs
    from keras_vllm.serve.process import start as engine_process

    print("SCRIPT BODY RAN", flush=True)  # must print once: no main guard
    jnp.zeros(1).block_until_ready()  # a live JAX runtime
    assert engine_process.jax_started()
    engine_process.PRELOAD = []
    engine_process.install = lambda: None  # vLLM's modules: not imported

    def vllm_context():  # vLLM's get_mp_context(): fork unless told spawn
        method = envs.WORKER_MULTIPROC_METHOD.raw() or "fork"
        return multiprocessing.get_context(method)

    # What keras-vllm's plugin installs in vLLM; no `skips_main()` here,
    # as in a plain `vllm.LLM(...)`: the processes hide `__main__` as
    # they start.
    get_mp_context = engine_process._fork_server_context(vllm_context)

    def start(name):
        context = get_mp_context()
        queue = context.SimpleQueue()
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

    from keras_vllm.serve.process.start import jax_started


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
        "from keras_vllm import envs\n"
        "from keras_vllm.serve.process import start as engine_process\n"
        "engine_process.choose()\n"
        "assert envs.WORKER_MULTIPROC_METHOD.raw() is None\n"
        "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()\n"
        "engine_process.install = lambda: None\n"
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
    assert lines[2] == "_SpawnContext 0 1|jax started: False"
    assert "JAX_ENABLE_X64 changed since the engine fork server started" in log


def test_an_explicit_fork_is_overridden_once_jax_runs():
    # A tutorial's `VLLM_WORKER_MULTIPROC_METHOD=fork` in a process that
    # trained: vLLM would fork the JAX runtime and hang. Overridden with a
    # warning, as vLLM does when CUDA is initialized; kept without JAX.
    env = {
        k: v for k, v in os.environ.items() if k != "KERAS_VLLM_ENGINE_START"
    }
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    code = (
        "from keras_vllm import envs\n"
        "from keras_vllm.serve.process import start as engine_process\n"
        "engine_process.install = lambda: None\n"
        "engine_process.choose()\n"
        "print('BEFORE', envs.WORKER_MULTIPROC_METHOD.raw())\n"
        "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()\n"
        "engine_process.choose()\n"
        "print('AFTER', envs.WORKER_MULTIPROC_METHOD.raw())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BEFORE fork" in result.stdout
    assert "AFTER spawn" in result.stdout
    assert "VLLM_WORKER_MULTIPROC_METHOD=fork, but JAX" in result.stderr
    assert result.stderr.count("overriding it to 'spawn'") == 1


_FORK_SCRIPT = textwrap.dedent(
    """
    import gc, multiprocessing, os, sys
    from keras_vllm.serve.process import start as engine_process

    inherited = [[i] for i in range(200_000)]  # the caller's objects

    def child(queue):
        queue.put(gc.get_freeze_count())

    def start():
        context = multiprocessing.get_context("fork")
        queue = context.SimpleQueue()
        before = gc.get_freeze_count()
        with engine_process.forks_frozen():
            process = context.Process(target=child, args=(queue,))
            process.start()
            during = gc.get_freeze_count()
        process.join(60)
        return before, queue.get(), during, gc.get_freeze_count()

    print("MODE", os.environ.get("MODE"), *start(), flush=True)
    """
)


def _run_fork_script(tmp_path, mode, **variables):
    script = tmp_path / "fork.py"
    script.write_text(_FORK_SCRIPT)
    env = {
        k: v for k, v in os.environ.items()
        if k not in ("VLLM_WORKER_MULTIPROC_METHOD",
                     "VLLM_ENABLE_V1_MULTIPROCESSING")
    }
    env.update(variables, MODE=mode)
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True,
        text=True, timeout=300,
    )
    line = [l for l in result.stdout.splitlines() if l.startswith("MODE ")]
    assert result.returncode == 0 and line, result.stderr[-3000:]
    return tuple(int(n) for n in line[0].split()[2:])


def test_a_forked_engine_process_skips_the_callers_objects(tmp_path):
    # vLLM's default: the engine process is forked from this one. The
    # child starts with the caller's objects frozen (its collections skip
    # them); the caller's own are unfrozen again afterwards.
    before, child, during, after = _run_fork_script(tmp_path, "fork")
    assert child >= before + 200_000 and during >= before + 200_000
    assert after <= before  # (gc.unfreeze() unfreezes everything)
    # An in-process engine freezes the heap itself (vLLM), and a spawned
    # engine process shares nothing: left alone.
    for mode, variables in (
        ("in-process", {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
        ("spawn", {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}),
    ):
        before, _, during, _ = _run_fork_script(tmp_path, mode, **variables)
        assert during == before, mode


def test_the_fork_server_preload_freezes_its_heap_quietly():
    # The server's children inherit the preloaded modules frozen. Its parent,
    # which started vLLM, said that the CPU backend is on: the server (a
    # fresh interpreter) does not say it again.
    code = (
        "import gc, keras_vllm.serve.process.preload\n"
        "print('FROZEN', gc.get_freeze_count())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=300,
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    frozen = int(result.stdout.split("FROZEN")[-1])
    assert frozen > 100_000  # vLLM, tpu-inference and keras-hub's objects
    assert "serving with tpu-inference on JAX CPU devices" not in (
        result.stderr
    )


# < 1 s of CI (in this process; the TPU's presence is stood in for).
def test_a_process_that_holds_the_tpu_runs_the_engine_itself(
    monkeypatch, caplog
):
    # A TPU opens in one process at a time: after JAX ran on it here (a
    # fine-tune, `generate()`), an engine process of its own cannot open it
    # (seen on the lent v5e with `keras-vllm demo`). `choose()` sets
    # variables itself, so the whole environment is restored afterwards.
    with mock.patch.dict(os.environ):
        _holds_the_tpu_checks(monkeypatch, caplog)


def _holds_the_tpu_checks(monkeypatch, caplog):
    import logging

    import jax.numpy as jnp

    from keras_vllm.serve.process import start as engine_process

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD"):
        os.environ.pop(name, None)
    monkeypatch.setattr(engine_process, "install", lambda: None)
    monkeypatch.setattr(engine_process, "_chosen", False)
    # On this CPU host JAX runs, but holds no TPU: nothing changes.
    jnp.zeros(1).block_until_ready()
    assert not engine_process.holds_tpu()
    engine_process.choose()
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)

    monkeypatch.setattr(engine_process, "holds_tpu", lambda: True)
    with caplog.at_level(logging.INFO, logger="keras_vllm"):
        engine_process.choose()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # In this process: no engine process to start, so no start method.
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ
    assert "already holds the TPU" in caplog.text
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)

    # Asked for an engine process explicitly: the same, with a warning.
    caplog.clear()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    with caplog.at_level(logging.INFO, logger="keras_vllm"):
        engine_process.choose()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=1, but this process" in caplog.text


# <1 s of CI.
def test_an_engine_started_beside_a_running_one_reads_the_environment_afresh(
    monkeypatch,
):
    # An engine core in this process freezes vLLM's environment reads until
    # it shuts down (`vllm.envs.enable_envs_cache`); an engine started here
    # meanwhile must get the environment as it is, not the first one's.
    import vllm.envs

    from keras_vllm.serve.process import start as engine_process

    monkeypatch.setattr(engine_process, "install", lambda: None)
    monkeypatch.setattr(engine_process, "_chosen", False)
    with mock.patch.dict(os.environ, {"VLLM_XLA_CACHE_PATH": "/first"}):
        vllm.envs.enable_envs_cache()
        try:
            os.environ["VLLM_XLA_CACHE_PATH"] = "/second"
            assert vllm.envs.VLLM_XLA_CACHE_PATH == "/first"  # frozen
            engine_process.choose()
            assert vllm.envs.VLLM_XLA_CACHE_PATH == "/second"
        finally:
            vllm.envs.disable_envs_cache()


# ~2 s of CI (vLLM's plugin registrations are idempotent; the TPU's presence
# is stood in for).
def test_a_plain_vllm_llm_in_a_process_holding_the_tpu_runs_there(monkeypatch):
    # `vllm.LLM(artifact)` reads its arguments (`EngineArgs.__post_init__`,
    # which loads vLLM's plugins, keras-vllm's `register` among them) before
    # `LLMEngine.from_engine_args` reads VLLM_ENABLE_V1_MULTIPROCESSING to
    # decide where the engine runs: the plugin is where a plain `vllm.LLM`
    # in a process holding the TPU learns to serve in it.
    from keras_vllm.serve import plugin
    from keras_vllm.serve.process import start as engine_process

    with mock.patch.dict(os.environ):
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        plugin.register()
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
        monkeypatch.setattr(engine_process, "holds_tpu", lambda: True)
        plugin.register()
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
