"""A Ray cluster of several nodes on this host, for multi-host tests.

Each node is its own `ray start` (the head first), with its own temp dir,
one CPU for Ray's scheduling, a `TPU` resource (the chips tpu-inference's
multi-host backend gives its worker: JAX CPU devices here) and a small
object store, started with `TPU_MULTIHOST_BACKEND=ray` as tpu-inference's
multi-host recipe does on every host of a slice. A node may be given
variables of its own (as a host's environment would), which vLLM's Ray
executor V2 keeps: it fills in only the driver's variables a worker lacks.
Stopping the cluster stops every process whose command line names its temp
dir, and their descendants, by id.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# Each node: one CPU for Ray's own scheduling and one "TPU" (one chip, which
# the CPU backend makes one JAX CPU device of); a small object store.
NODE_ARGS = ["--num-cpus", "1", "--resources", json.dumps({"TPU": 1}),
             "--object-store-memory", str(80 * 1024 * 1024),
             "--disable-usage-stats"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_under(marker):
    """Pids of processes whose command line names `marker`, and their
    descendants (this process excepted)."""
    parents, roots = {}, set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents[int(entry)] = ppid
        if marker in command:
            roots.add(int(entry))
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    found.discard(os.getpid())
    return found


def stop(marker):
    """Stops every process under `marker`; returns the pids left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = processes_under(marker)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15
        while pids and time.time() < deadline:
            pids = {p for p in pids if os.path.exists(f"/proc/{p}")}
            time.sleep(0.5)
        if not pids:
            return set()
    return pids


@contextlib.contextmanager
def running_cluster(node_env=({}, {})):
    """Starts one Ray node per entry of `node_env` (the head first, each
    with those variables added to this process's); yields the head's
    `host:port`. Every process of the cluster is stopped on exit, and an
    `AssertionError` names any left.
    """
    # Short: Ray's socket paths live under it (Unix sockets allow ~107 bytes).
    root = tempfile.mkdtemp(prefix="kvray", dir="/tmp")
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = dict(os.environ, TPU_MULTIHOST_BACKEND="ray",
               RAY_USAGE_STATS_ENABLED="0")
    try:
        for i, extra in enumerate(node_env):
            where = (["--head", "--port", str(port), "--include-dashboard",
                      "false"] if i == 0 else ["--address", address])
            subprocess.run(
                [RAY, "start", *where, "--node-ip-address", "127.0.0.1",
                 "--temp-dir", os.path.join(root, f"node{i + 1}"),
                 *NODE_ARGS],
                env=env | dict(extra), check=True, capture_output=True,
                timeout=180)
        yield address
    finally:
        left = stop(root)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes still running: {sorted(left)}"
