"""How vLLM's engine process starts from a process that runs JAX.

vLLM forks its engine process by default, and a forked child of a process
with a live JAX runtime aborts or hangs. A process that trained or exported
a model in memory has one, so then the engine process starts from a clean
interpreter instead, in one of two ways (`KERAS_VLLM_ENGINE_START`):

- `forkserver` (the default): Python's fork server, a clean process that
  imports vLLM, tpu-inference and keras-hub once (about 25 s on a small
  CPU host, without starting JAX) and forks each engine process from that
  state. The first engine of a process costs what a spawned one does;
  every later one (a notebook or a test session that serves several
  models) starts without re-importing anything. Each engine process gets
  the environment its parent had when it started it, not the fork
  server's.
- `spawn`: a fresh interpreter per engine process.

Both keep the caller's `__main__` from being re-run in the engine process
(the processes hide it while they start), so a top-level script needs no
`if __name__ == "__main__":` guard.

vLLM (pinned 0.32.0) offers only fork and spawn
(`VLLM_WORKER_MULTIPROC_METHOD`); these are given to it by rebinding
`get_mp_context` in the modules that start its processes
(`_VLLM_STARTERS`), while the variable says `spawn`, which vLLM's own
checks then see. `KerasVllmEngine.from_export` chooses before it makes its
`vllm.LLM`; keras-vllm's vLLM plugin installs the rebinding in every vLLM
process, so a plain `vllm.LLM(artifact)` is asked too, when it starts
the process.
"""

import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import sys

from keras_vllm import envs
from keras_vllm import patching

logger = logging.getLogger("keras_vllm")

# What the fork server imports before forking engine processes: the
# modules an engine process would import first anyway. None starts JAX.
PRELOAD = ["keras_vllm.serve.process.preload"]

# vLLM modules that start processes with `get_mp_context()` (pinned 0.32.0).
_VLLM_STARTERS = (
    "vllm.v1.engine.utils",
    "vllm.v1.engine.coordinator",
    "vllm.v1.executor.multiproc_executor",
)

# Variables read when modules are imported (JAX's and Keras' flags,
# TensorFlow's, vLLM's import-time settings): a fork server started with
# other values than a later engine needs cannot serve that engine, which is
# then spawned. keras-vllm's own variables are read when used.
_IMPORT_TIME_PREFIXES = ("JAX_", "KERAS_", "TF_", "VLLM_", "TPU_", "PJRT_")
_READ_WHEN_USED = ("KERAS_VLLM_", "VLLM_WORKER_MULTIPROC_METHOD")


def _started_backends():
    """The names of the JAX backends this process has started (an empty
    set without JAX), or None where jax's internals are unknown."""
    if "jax" not in sys.modules:
        return set()
    try:
        from jax._src import xla_bridge

        return set(xla_bridge._backends)
    except (ImportError, AttributeError):
        return None


def jax_started():
    """Whether this process has already started a JAX runtime."""
    backends = _started_backends()
    # Unknown jax internals: assume started, a clean start is safe.
    return backends is None or bool(backends)


def _import_time_environment():
    return {
        key: value
        for key, value in os.environ.items()
        if key.startswith(_IMPORT_TIME_PREFIXES)
        and not key.startswith(_READ_WHEN_USED)
    }


class _EngineProcess(multiprocessing.context.ForkServerProcess):
    """A fork-server process that runs with its parent's environment.

    The fork server's environment is the one it started with; the
    parent's, captured when the process starts (vLLM sets variables around
    `start()`), is restored in the child before its target runs.
    """

    def start(self):
        self._parent_environment = dict(os.environ)
        with _main_hidden():
            super().start()

    def run(self):
        os.environ.clear()
        os.environ.update(self._parent_environment)
        _exits_without_collecting()
        super().run()


class _EngineContext(multiprocessing.context.ForkServerContext):
    Process = _EngineProcess


class _SpawnedEngineProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that does not re-run the caller's `__main__`."""

    def start(self):
        with _main_hidden():
            super().start()

    def run(self):
        _exits_without_collecting()
        super().run()


def _exits_without_collecting():
    """Skips the engine process's last full garbage collection.

    vLLM's engine core ends its shutdown with `gc.unfreeze()` and a full
    `gc.collect()` (`cleanup_dist_env_and_memory`), to free memory for an
    engine that runs inside a longer-lived process. An engine process that
    keras-vllm started ends right after it, and its heap holds everything
    the fork server imported (vLLM, torch, Keras, keras-hub: millions of
    objects): walking them delays `engine.shutdown()` by 2-5 s on a small
    CPU host, to free memory the exit frees anyway. Everything else of the
    teardown runs as before.
    """
    import gc

    from vllm.v1.engine import core

    def without_collection(original):
        def cleanup_dist_env_and_memory(*args, **kwargs):
            # From here on the process only tears down and exits.
            patching.replace(gc, "collect", lambda _: _no_collection)
            return original(*args, **kwargs)

        return cleanup_dist_env_and_memory

    patching.replace(core, "cleanup_dist_env_and_memory", without_collection)


def _no_collection(*args, **kwargs):
    return 0


class _SpawnContext(multiprocessing.context.SpawnContext):
    Process = _SpawnedEngineProcess


_CONTEXT = _EngineContext()
_SPAWN_CONTEXT = _SpawnContext()
# Whether `choose()` switched this process's engine starts to a clean
# interpreter (a caller's own `VLLM_WORKER_MULTIPROC_METHOD=spawn` is kept).
_chosen = False
# The environment the fork server started with (None: not started here).
_server_environment = None


def _fork_server_context(original):
    """vLLM's `get_mp_context`, answering with a clean start when needed.

    Asked right before vLLM starts a process, so a JAX runtime that started
    after the engine's arguments were read (or in a plain `vllm.LLM(...)`,
    where no `from_export` chose first) is still seen.
    """

    def get_mp_context():
        choose()
        context = original()
        if not _chosen or context.get_start_method() != "spawn":
            return context
        return _CONTEXT if _use_fork_server() else _SPAWN_CONTEXT

    return get_mp_context


def _use_fork_server():
    global _server_environment
    if envs.ENGINE_START.get() != "forkserver":
        return False
    environment = _import_time_environment()
    if _server_environment is None:
        multiprocessing.forkserver.set_forkserver_preload(PRELOAD)
        _server_environment = environment
        return True
    if environment != _server_environment:
        changed = sorted(
            set(environment.items()) ^ set(_server_environment.items())
        )
        logger.info(
            "keras-vllm: %s changed since the engine fork server started, so "
            "this engine process is spawned.",
            ", ".join(sorted({key for key, _ in changed})),
        )
        return False
    return True


def install():
    """Makes vLLM's process starts in this process check for JAX first.

    keras-vllm's vLLM plugin calls this in every vLLM process, so that a
    plain `vllm.LLM(artifact)` in a process that trained a model (a
    top-level script, a notebook) starts its engine process from a clean
    interpreter too (`choose()`), instead of forking a JAX runtime, which
    hangs. Processes without a JAX runtime start theirs as vLLM would.
    """
    import importlib

    for name in _VLLM_STARTERS:
        module = importlib.import_module(name)
        patching.replace(module, "get_mp_context", _fork_server_context)


def holds_tpu():
    """Whether this process's JAX runtime has opened a TPU."""
    return "tpu" in (_started_backends() or ())


def run_here_if_holding_tpu():
    """Runs the engine in this process when this process holds the TPU.

    A TPU opens in one process at a time: after a model trained, exported
    or ran `generate()` here, an engine process of its own cannot open the
    chip. The engine then runs in this process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), beside the caller's arrays (vLLM
    sizes its KV cache from what is free). `choose()` asks before
    `KerasVllmEngine.from_export` makes its `vllm.LLM`; keras-vllm's plugin
    asks when vLLM loads it, which vLLM does while reading an engine's
    arguments, before it decides where the engine runs: a plain
    `vllm.LLM(artifact)` is covered too.
    """
    if not envs.ENABLE_V1_MULTIPROCESSING.get() or not holds_tpu():
        return
    if envs.ENABLE_V1_MULTIPROCESSING.raw() is not None:
        logger.warning(
            "keras-vllm: VLLM_ENABLE_V1_MULTIPROCESSING=%s, but this process "
            "already holds the TPU (JAX ran here), which an engine process "
            "of its own cannot open; the engine runs in this process. Start "
            "the engine before any JAX work to serve from its own process.",
            envs.ENABLE_V1_MULTIPROCESSING.raw(),
        )
    else:
        logger.info(
            "keras-vllm: this process already holds the TPU (JAX ran here), "
            "so the engine runs in it rather than in a process of its own."
        )
    envs.ENABLE_V1_MULTIPROCESSING.set("0")


def read_environment_afresh():
    """Has vLLM read its environment variables again from now on.

    An engine core started in this process freezes vLLM's reads of them
    (`vllm.envs.enable_envs_cache`, called in `EngineCore.__init__`) until
    it shuts down, so an engine started here while another runs here would
    get the first one's settings (`VLLM_ENABLE_V1_MULTIPROCESSING`,
    `VLLM_XLA_CACHE_PATH`, ...), whatever the environment says by then. The
    next engine core freezes them again.
    """
    import vllm.envs

    vllm.envs.disable_envs_cache()


def choose():
    """Picks how vLLM starts the engine process for an engine made here.

    Call before `vllm.LLM(...)`. Nothing changes when this process has no
    JAX runtime (vLLM forks) or `VLLM_WORKER_MULTIPROC_METHOD` says
    `spawn`. An explicit `fork` is overridden, with a warning, as vLLM
    overrides it when CUDA is initialized: a forked JAX runtime hangs. A
    process that holds the TPU runs the engine itself (no other process
    can open the chip). vLLM reads its environment afresh for the engine.
    """
    global _chosen
    read_environment_afresh()
    run_here_if_holding_tpu()
    asked = envs.WORKER_MULTIPROC_METHOD.raw()
    if (
        asked not in (None, "fork")
        or not jax_started()
        or not envs.ENABLE_V1_MULTIPROCESSING.get()
    ):
        return
    if asked == "fork":
        logger.warning(
            "keras-vllm: VLLM_WORKER_MULTIPROC_METHOD=fork, but JAX is "
            "already running in this process, and a forked JAX runtime "
            "hangs; overriding it to 'spawn'. Unset the variable, or start "
            "the engine before any JAX work, to silence this."
        )
    envs.WORKER_MULTIPROC_METHOD.set("spawn")
    _chosen = True
    method = envs.ENGINE_START.get()
    install()
    logger.info(
        "keras-vllm: JAX is already running in this process, so vLLM's "
        "engine process starts from a clean interpreter (%s) rather than "
        "being forked.",
        "fork server" if method == "forkserver" else "spawned",
    )


@contextlib.contextmanager
def skips_main():
    """Keeps a clean engine process from re-running the caller's script.

    A spawned (or fork-server) child re-imports the parent's `__main__` (by
    path, or by module name under `python -m`) before it runs its target.
    A top-level script without an `if __name__ == "__main__":` guard, the
    way tutorials and notebooks-turned-scripts are written, would then
    fine-tune and export again in the engine process and die in
    multiprocessing's "bootstrapping phase" error. vLLM's engine process
    needs nothing from the caller's `__main__` (its target and arguments
    are vLLM's), so while it starts, `__main__` is presented as an
    interactive session, which is not re-imported.
    """
    if envs.WORKER_MULTIPROC_METHOD.raw() != "spawn":
        yield
        return
    with _main_hidden():
        yield


@contextlib.contextmanager
def _main_hidden():
    """`__main__` presented as an interactive session (see `skips_main`)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {
        key: main.__dict__[key]
        for key in ("__file__", "__spec__")
        if key in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@contextlib.contextmanager
def forks_frozen():
    """Keeps a forked engine process from copying the caller's heap.

    vLLM's engine process collects garbage once when it starts
    (`freeze_gc_heap`). A forked child shares its parent's memory
    copy-on-write, and a full collection touches every object the parent
    ever made (vLLM, torch, TensorFlow, Keras: over a million), so each of
    their pages is copied: about 4 s of the engine start on a small CPU
    host, and as much memory. Objects frozen (`gc.freeze`) before the fork
    are skipped by the child's collections. The caller's objects are
    unfrozen again afterwards, so its own collections are unchanged.

    Only when vLLM forks the engine process from this one (its default,
    without a JAX runtime here): an in-process engine freezes the heap
    itself, and a spawned or fork-server child does not share this heap
    (the fork server freezes its own, `serve/process/preload.py`).
    """
    forks = (
        envs.ENABLE_V1_MULTIPROCESSING.get()
        and envs.WORKER_MULTIPROC_METHOD.raw() in (None, "fork")
    )
    if not forks:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
