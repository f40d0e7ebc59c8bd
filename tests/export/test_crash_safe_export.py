"""Crash-safe export: SIGKILL at many points, and a full disk.

Exporting processes are killed (SIGKILL) at deterministic points of an
export over an existing artifact (before staging, after the tokenizer, at
the start and end of the weights, after config.json, during golden
outputs, after the manifest, during fsync, before and inside the publishing
rename, during cleanup) and at random delays. Afterwards the target must be
the previous artifact or the new one, complete (checksums pass and it
loads); never a partial artifact. Killed exports into a fresh path must
leave nothing at the target.

To keep it affordable on a small CPU machine, one `python -c` "zygote"
process imports keras-vllm once (which does not start JAX) and forks one
exporting child per kill point; each child loads a tiny preset, starts JAX
and exports, and the test or the child itself SIGKILLs it.
"""

import errno
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing

import functools


@functools.lru_cache(maxsize=None)
def tiny_llama():
    return testing.build_tiny_causal_lm("llama")

# Points where the child kills itself (see _ZYGOTE).
KILL_POINTS = [
    "start",  # before anything is written
    "staging_created",  # the staging directory exists, still empty
    "tokenizer_written",  # tokenizer assets and config in staging
    "weights_start",  # orbax about to write
    "weights_mid",  # orbax writing (timer thread kills 0.05s in)
    "weights_done",  # orbax finished
    "config_written",  # config.json / generation_config.json written
    "golden_running",  # during golden generation
    "manifest_written",  # manifest in staging, not yet published
    "fsync",  # fsyncing the staging tree
    "before_publish",  # complete staging, publish not called
    "after_exchange",  # renameat2 swapped: old artifact in staging dir
    "cleanup",  # removing the old artifact after the swap
]
RANDOM_KILLS = 3
FRESH_KILL_POINTS = ["weights_mid", "manifest_written"]

_ZYGOTE = r"""
import json, os, sys, signal, threading
import keras_vllm
# keras-hub's import (15-25 s here) is paid once, before forking: it does
# not start JAX, and the zygote stays single-threaded.
import keras, keras_hub
from keras_vllm import format as fmt
from keras_vllm.hub import reference
from keras_vllm.hub import checkpoint
from keras_vllm.export import sections, staging
from keras_vllm.serve.process.start import jax_started as _jax_started
assert not _jax_started()
assert threading.active_count() == 1
print("ZYGOTE READY", flush=True)


def die(point):
    print(f"KILLING {os.getpid()} at {point}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def hook(module, name, point, when="before", match=None):
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        if match is not None and not match(*args):
            return original(*args, **kwargs)
        if when == "before":
            die(point)
        if when == "during":
            threading.Timer(0.05, die, (point,)).start()
        result = original(*args, **kwargs)
        if when == "after":
            die(point)
        return result

    setattr(module, name, wrapper)


def install(point):
    is_file = lambda name: (lambda path, *a: str(path).endswith(name))
    if point == "staging_created":
        hook(sections, "tokenizer_section", point)
    elif point == "tokenizer_written":
        hook(sections, "tokenizer_section", point, "after")
    elif point == "weights_start":
        hook(checkpoint, "save_weights", point)
    elif point == "weights_mid":
        hook(checkpoint, "save_weights", point, "during")
    elif point == "weights_done":
        hook(checkpoint, "save_weights", point, "after")
    elif point == "config_written":
        hook(fmt, "write_json", point, "after",
             is_file(fmt.GENERATION_CONFIG_FILE))
    elif point == "golden_running":
        # Golden outputs are generated in a thread while files are written.
        hook(reference, "greedy_batch", point, "during")
    elif point == "manifest_written":
        hook(fmt, "write_json", point, "after",
             is_file(fmt.MANIFEST_FILE))
    elif point == "fsync":
        hook(staging, "_fsync_tree", point)
    elif point == "before_publish":
        hook(staging, "publish", point)
    elif point == "after_exchange":
        hook(staging, "_exchange", point, "after")
    elif point == "cleanup":
        # Only the removal of the swapped-out old artifact after publishing
        # (not the removal of stale staging directories at the start).
        import shutil
        exchanged = []
        exchange = staging._exchange
        def exchange_and_flag(a, b):
            result = exchange(a, b)
            exchanged.append(result)
            return result
        staging._exchange = exchange_and_flag
        original = shutil.rmtree
        def rmtree(path, *a, **k):
            if exchanged and ".staging-" in str(path):
                die(point)
            return original(path, *a, **k)
        staging.shutil.rmtree = rmtree


def child(request):
    point = request.get("kill")
    if point == "start":
        die(point)
    causal_lm = keras_hub.models.CausalLM.from_preset(request["preset"])
    causal_lm.compile(sampler="greedy")
    # Differ from the previous artifact, so old and new can be told apart.
    variable = causal_lm.backbone.weights[0]
    variable.assign(variable.value * 1.01)
    if point:
        install(point)
    print(f"READY {os.getpid()}", flush=True)
    path = causal_lm.export_vllm(
        request["target"],
        overwrite=True,
        weights="full",
        golden_prompts=("The", "Hello world"),
        golden_max_new_tokens=4,
    )
    print(f"EXPORTED {path}", flush=True)


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            child(request)
            code = 0
        except BaseException as e:
            print(f"CHILD ERROR {type(e).__name__}: {e}", flush=True)
            code = 1
        sys.stdout.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(f"EXIT {pid} {status}", flush=True)
"""


class Zygote:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.lines = []
        # A reader thread, not select() on the buffered pipe (which can hold
        # several lines already read).
        self.queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._wait_for("ZYGOTE READY", 600)

    def _pump(self):
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put(None)

    def _readline(self, deadline):
        remaining = deadline - time.monotonic()
        try:
            line = self.queue.get(timeout=max(remaining, 0.01))
        except queue.Empty:
            raise TimeoutError("exporting process did not answer in time")
        if line is None:
            raise RuntimeError("zygote exited:\n" + "".join(self.lines[-20:]))
        self.lines.append(line)
        return line.strip()

    def _wait_for(self, prefix, timeout):
        deadline = time.monotonic() + timeout
        while True:
            line = self._readline(deadline)
            if line.startswith(prefix):
                return line

    def export(self, target, preset, kill=None, kill_after=None, timeout=600):
        """Runs one export; returns (how it ended, output lines)."""
        start = len(self.lines)
        request = {"target": target, "preset": preset, "kill": kill}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            line = self._readline(deadline)
            if line.startswith("READY") and kill_after is not None:
                pid = int(line.split()[1])
                time.sleep(kill_after)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if line.startswith("EXIT"):
                status = int(line.split()[2])
                return status, self.lines[start:]

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    directory = tmp_path_factory.mktemp("preset") / "tiny_llama"
    return testing.save_tiny_preset(tiny_llama(), directory)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


def _fingerprint(path):
    manifest = fmt.open_artifact(path).manifest  # checksums of every file
    return json.dumps(manifest["files"], sort_keys=True)


def _staging_leftovers(parent, target):
    prefix = f".{os.path.basename(target)}.staging-"
    return [n for n in os.listdir(parent) if n.startswith(prefix)]


def test_sigkill_during_export_keeps_an_intact_artifact(zygote, preset, tmp_path):
    target = str(tmp_path / "artifact")
    causal_lm = tiny_llama()
    causal_lm.export_vllm(
        target, golden_prompts=("The",), golden_max_new_tokens=2
    )
    old = _fingerprint(target)
    rng = random.Random(0)
    plan = [(p, None) for p in KILL_POINTS] + [
        (None, rng.uniform(0.1, 2.0)) for _ in range(RANDOM_KILLS)
    ]
    report = []
    for point, delay in plan:
        status, lines = zygote.export(target, preset, kill=point, kill_after=delay)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        label = point or f"random {delay:.2f}s"
        # The target exists (the old artifact is never removed before the
        # new one replaces it) and is complete.
        assert os.path.isdir(target), f"{label}: target vanished"
        current = _fingerprint(target)
        state = "old" if current == old else "new"
        report.append((label, "killed" if killed else "finished", state))
        if not killed:
            assert any(l.startswith("EXPORTED") for l in lines), lines
        # Every kill point before publishing must leave the old artifact.
        if point in KILL_POINTS[: KILL_POINTS.index("before_publish") + 1]:
            assert killed, (label, lines[-5:])
            assert state == "old", f"{label}: target changed before publishing"
        if point in ("after_exchange", "cleanup"):
            assert killed and state == "new", (label, state)
        if state == "new":
            old = current  # the next kill must preserve this one
    print("\nkill point                 outcome   target")
    for label, outcome, state in report:
        print(f"{label:26s} {outcome:9s} {state}")
    assert sum(1 for _, o, _ in report if o == "killed") >= 10
    # The artifact left at the target loads.
    loaded = keras_vllm.load_causal_lm(target)
    assert loaded.backbone.count_params() == causal_lm.backbone.count_params()
    # Leftover staging directories are hidden and never at the target; the
    # next export removes them.
    status, lines = zygote.export(target, preset)
    assert status == 0, lines
    assert _staging_leftovers(str(tmp_path), target) == []
    fmt.open_artifact(target).manifest


def test_sigkill_fresh_export_leaves_nothing(zygote, preset, tmp_path):
    for point in FRESH_KILL_POINTS:
        target = str(tmp_path / f"fresh_{point}")
        status, lines = zygote.export(target, preset, kill=point)
        assert os.WIFSIGNALED(status), lines
        assert not os.path.exists(target), f"{point}: partial artifact at target"
        with pytest.raises(keras_vllm.ArtifactError, match="not a directory"):
            keras_vllm.load_causal_lm(target)


# --------------------------------------------------------------------------
# A full disk.
# --------------------------------------------------------------------------


def _mount_tmpfs(directory, size_bytes, readonly=False):
    os.makedirs(directory, exist_ok=True)
    options = f"size={size_bytes}" + (",ro" if readonly else "")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", directory],
        capture_output=True,
    )
    return result.returncode == 0


def _umount(directory):
    subprocess.run(["umount", directory], capture_output=True)


def _tree_bytes(path):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, files in os.walk(path)
        for name in files
    )


def _export_old(target):
    return tiny_llama().export_vllm(
        target, golden_prompts=("The",), golden_max_new_tokens=2
    )


def test_full_disk_keeps_old_artifact(tmp_path):
    causal_lm = tiny_llama()
    reference = _export_old(str(tmp_path / "reference"))
    size = _tree_bytes(reference)
    mount = str(tmp_path / "small_disk")
    # Room for the old artifact and a little more, not for a second copy.
    if not _mount_tmpfs(mount, size + size // 3 + 64 * 1024):
        pytest.skip("cannot mount a tmpfs here; see the simulated variant")
    try:
        target = os.path.join(mount, "artifact")
        shutil.copytree(reference, target)
        old = _fingerprint(target)
        with pytest.raises(keras_vllm.ExportError) as info:
            causal_lm.export_vllm(target, overwrite=True, weights="full")
        message = str(info.value)
        print("\nfull disk:", message)
        assert "No space left" in message or "ENOSPC" in message, message
        assert _fingerprint(target) == old
        keras_vllm.load_causal_lm(target)
        assert _staging_leftovers(mount, target) == []
        # Nothing at a fresh path either.
        fresh = os.path.join(mount, "fresh")
        with pytest.raises(keras_vllm.ExportError):
            causal_lm.export_vllm(fresh)
        assert not os.path.exists(fresh)
    finally:
        _umount(mount)


def test_full_disk_simulated(tmp_path, monkeypatch):
    """ENOSPC raised from inside the weight writer (no mount needed)."""
    from keras_vllm.hub import checkpoint

    target = _export_old(str(tmp_path / "artifact"))
    old = _fingerprint(target)

    def full(directory, weights):
        os.makedirs(directory)
        with open(os.path.join(directory, "partial"), "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), directory)

    monkeypatch.setattr(checkpoint, "save_weights", full)
    with pytest.raises(keras_vllm.ExportError, match="No space left"):
        tiny_llama().export_vllm(target, overwrite=True, weights="full")
    assert _fingerprint(target) == old
    assert _staging_leftovers(str(tmp_path), target) == []
