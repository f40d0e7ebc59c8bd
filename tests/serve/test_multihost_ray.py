"""Multi-host serving through vLLM's Ray executor, on two Ray nodes of this host.

The module starts a Ray cluster of two nodes on this machine (`ray start
--head`, then `ray start --address`, each with its own temp dir and one
`TPU` resource, as tpu-inference's multi-host recipe does on a TPU slice),
and one engine with `TPU_MULTIHOST_BACKEND=ray` and `tensor_parallel_size=2`:
vLLM's Ray executor (V2) puts one worker on each node, each worker is its own
JAX process with one CPU device, and JAX's distributed runtime (Gloo CPU
collectives) joins them into one program whose mesh spans both nodes
(`keras_vllm/cpu/multihost.py`). The artifact is signed and served with a
public key, which reaches both workers through the `KERAS_` variables vLLM's
Ray executor copies. Teardown stops every process the cluster started (found
by its temp dir, and their children), even when a test fails.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("tpu_inference")
pytest.importorskip("ray")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from helpers import serving_checks  # noqa: E402
from helpers.trained_models import trained  # noqa: E402

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# Each node: one CPU for Ray's own scheduling and one "TPU" (one chip, which
# the CPU backend makes one JAX CPU device of); a small object store.
NODE_ARGS = ["--num-cpus", "1", "--resources", json.dumps({"TPU": 1}),
             "--object-store-memory", str(80 * 1024 * 1024),
             "--disable-usage-stats"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_under(marker):
    """Pids of processes whose command line names `marker`, and their
    descendants."""
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


def _stop(marker):
    """Stops every process of the cluster whose temp dir is `marker`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _processes_under(marker)
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
            return
    return pids


@pytest.fixture(scope="module")
def cluster():
    """A two-node Ray cluster on this host, stopped with all its processes."""
    # Short: Ray's socket paths live under it (Unix sockets allow ~107 bytes).
    root = tempfile.mkdtemp(prefix="kvray", dir="/tmp")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = dict(os.environ, TPU_MULTIHOST_BACKEND="ray",
               RAY_USAGE_STATS_ENABLED="0")
    try:
        subprocess.run(
            [RAY, "start", "--head", "--node-ip-address", "127.0.0.1",
             "--port", str(port), "--include-dashboard", "false",
             "--temp-dir", os.path.join(root, "head"), *NODE_ARGS],
            env=env, check=True, capture_output=True, timeout=180)
        subprocess.run(
            [RAY, "start", "--address", address, "--node-ip-address",
             "127.0.0.1", "--temp-dir", os.path.join(root, "node2"),
             *NODE_ARGS],
            env=env, check=True, capture_output=True, timeout=180)
        yield address
    finally:
        left = _stop(root)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes still running: {sorted(left)}"


def _write_keys(directory):
    key = ec.generate_private_key(ec.SECP256R1())
    private = os.path.join(directory, "key.pem")
    public = os.path.join(directory, "key.pub.pem")
    with open(private, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(public, "wb") as f:
        f.write(key.public_key().public_bytes(
            serialization.Encoding.PEM,
            serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def served(cluster, tmp_path_factory):
    import keras_vllm
    from helpers import engine_shapes
    from keras_vllm import testing

    model = trained("llama")
    root = tmp_path_factory.mktemp("multihost")
    private, public = _write_keys(str(root))
    path = model.export_vllm(
        root / "artifact", max_sequence_length=256,
        golden_prompts=testing.prompts()[:2], signing_key=private)
    patch = pytest.MonkeyPatch()
    patch.setenv("TPU_MULTIHOST_BACKEND", "ray")
    patch.setenv("RAY_ADDRESS", cluster)
    # The worker facts below cross to the workers as a pickled function.
    patch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    patch.setenv("KERAS_VLLM_MULTIHOST_PROBE", "reaches every worker")
    try:
        engine = keras_vllm.KerasVllmEngine.from_export(
            path, public_key=public, tensor_parallel_size=2,
            **engine_shapes.ENGINE_KWARGS)
        yield model, engine, public
        serving_checks.shutdown(engine)
    finally:
        patch.undo()


def test_one_program_spans_both_nodes(served):
    """One worker per Ray node, each its own JAX process with one device,
    the mesh made of both; the signing key and KERAS_* reach both."""
    _, engine, public = served

    # Defined here: cloudpickle sends a nested function by value (the
    # workers cannot import this test module).
    def worker_facts(worker):
        import jax
        import ray

        return {
            "process": jax.process_index(),
            "processes": jax.process_count(),
            "local_devices": len(jax.local_devices()),
            "mesh_processes": sorted({
                d.process_index
                for d in worker.model_runner.mesh.devices.flat}),
            "node": ray.get_runtime_context().get_node_id(),
            "public_key": os.environ.get("KERAS_VLLM_PUBLIC_KEY"),
            "probe": os.environ.get("KERAS_VLLM_MULTIHOST_PROBE"),
            "backend": os.environ.get("KERAS_BACKEND"),
        }

    facts = engine.llm.collective_rpc(worker_facts)
    assert len(facts) == 2
    assert sorted(f["process"] for f in facts) == [0, 1]
    assert len({f["node"] for f in facts}) == 2
    for fact in facts:
        assert fact["processes"] == 2
        assert fact["local_devices"] == 1
        assert fact["mesh_processes"] == [0, 1]
        assert fact["public_key"] == public
        assert fact["probe"] == "reaches every worker"
        assert fact["backend"] == "jax"


def test_each_node_holds_its_share(served):
    """Each worker's arrays lie on its own device only, half of the split
    variables each."""
    _, engine, _ = served
    layouts = engine.llm.collective_rpc("keras_vllm_weights")
    assert len(layouts) == 2
    held = [layout["devices"] for layout in layouts]
    # Mesh order is process order: worker i holds bytes on device i only.
    assert held[0][0] > 0 and held[0][1] == 0
    assert held[1][1] > 0 and held[1][0] == 0
    split = [v for v in layouts[0]["variables"].values()
             if any(axis is not None for axis in v["spec"])]
    assert split, "no variable is split over the two nodes"


def test_greedy_matches_generate(served):
    model, engine, _ = served
    serving_checks.check_greedy_matches_generate(engine, model)


def test_prompt_logprobs_match_forward_pass(served):
    model, engine, _ = served
    serving_checks.check_prompt_logprobs(engine, model, atol=1e-4)


def test_golden_outputs(served):
    _, engine, _ = served
    assert engine.check_golden() == []
