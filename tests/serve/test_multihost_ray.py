"""Multi-host serving through vLLM's Ray executor, on two Ray nodes of this host.

The module starts a Ray cluster of two nodes on this machine (`ray start
--head`, then `ray start --address`, each with its own temp dir and one
`TPU` resource, as tpu-inference's multi-host recipe does on a TPU slice;
`helpers/ray_cluster.py`). Its engines run with `TPU_MULTIHOST_BACKEND=ray`
and tensor parallelism 2: vLLM's Ray executor (V2) puts one worker on each
node, each worker is its own JAX process with one CPU device, and JAX's
distributed runtime (Gloo CPU collectives) joins them into one program
whose mesh spans both nodes (`keras_vllm/cpu/multihost.py`). One engine at
a time holds the nodes:

- `KerasVllmEngine.from_export` of a signed artifact served with a public
  key, which reaches the workers through the `KERAS_` variables vLLM's Ray
  executor copies (node 2 keeps the key path its own environment sets);
- plain `vllm serve` of a signed delta artifact whose preset lies beside it
  (`KERAS_VLLM_PRESET`), over HTTP;
- the same command once node 2's own key no longer matches: node 2's worker
  refuses the artifact and the engine does not start.

Teardown stops every process the cluster started (found by its temp dir,
and their children), even when a test fails.
"""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("tpu_inference")
pytest.importorskip("ray")
requests = pytest.importorskip("requests")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from helpers import engine_shapes  # noqa: E402
from helpers import ray_cluster  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers.http_server import running_server  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm import testing  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402

VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")
# One engine at a time holds both nodes' TPUs: how to stop the running one.
_RUNNING = []


def _free_the_cluster():
    while _RUNNING:
        _RUNNING.pop()()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The signing key pair, and node 2's own copy of the public key."""
    root = tmp_path_factory.mktemp("keys")
    private, public = _write_keys(str(root))
    node2 = str(root / "node2.pub.pem")
    shutil.copy(public, node2)
    return private, public, node2


@pytest.fixture(scope="module")
def cluster(keys):
    """Two Ray nodes on this host; node 2 has its own
    `KERAS_VLLM_PUBLIC_KEY` (a host's own setting, which vLLM's Ray
    executor V2 keeps over the driver's)."""
    node2 = {"KERAS_VLLM_PUBLIC_KEY": keys[2]}
    try:
        with ray_cluster.running_cluster(({}, node2)) as address:
            yield address
    finally:
        _free_the_cluster()


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
def served(cluster, keys, tmp_path_factory):
    import keras_vllm

    model = trained("llama")
    root = tmp_path_factory.mktemp("multihost")
    private, public, _ = keys
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
        # Stopped (and its variables gone) before the next engine starts.
        _RUNNING.append(lambda: (serving_checks.shutdown(engine),
                                 patch.undo()))
        yield model, engine, keys
        _free_the_cluster()
    finally:
        patch.undo()


def test_one_program_spans_both_nodes(served):
    """One worker per Ray node, each its own JAX process with one device,
    the mesh made of both; the signing key and KERAS_* reach both (node 2
    keeps the key path its own environment sets)."""
    _, engine, (_, public, node2_public) = served

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
    by_process = sorted(facts, key=lambda f: f["process"])
    assert [f["public_key"] for f in by_process] == [public, node2_public]
    for fact in facts:
        assert fact["processes"] == 2
        assert fact["local_devices"] == 1
        assert fact["mesh_processes"] == [0, 1]
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


# --- Plain `vllm serve` across the two nodes: a signed delta artifact with
# its preset beside it (`KERAS_VLLM_PRESET`), then node 2 with a key that
# does not match.


@pytest.fixture(scope="module")
def delta(keys, tmp_path_factory):
    """`(tuned model, artifact, preset)`: a signed delta of a fine-tuned
    llama on a "shared" directory, its preset moved beside it after the
    export (so only `KERAS_VLLM_PRESET` finds it)."""
    import keras_hub

    import keras_vllm  # noqa: F401 (records the preset `from_preset` loads)

    root = tmp_path_factory.mktemp("shared")
    base = testing.save_tiny_preset(trained("llama"), root / "exported_from")
    tuned = keras_hub.models.CausalLM.from_preset(base)
    # One output projection changed (negated: a greedy continuation the
    # base model would also give proves nothing): the delta holds only it.
    layer = tuned.backbone.transformer_layers[-1]
    kernel = layer._feedforward_output_dense.kernel
    kernel.assign(kernel.numpy() * -1.0)
    path = tuned.export_vllm(root / "artifact", max_sequence_length=256,
                             golden_prompts=(), signing_key=keys[0])
    preset = str(root / "preset")
    os.rename(base, preset)
    return tuned, path, preset


@pytest.fixture(scope="module")
def head_environment(cluster, delta, keys):
    """The variables a user sets on the head to serve the delta across the
    nodes: the multi-host backend, Ray's address, the preset and the public
    key."""
    _free_the_cluster()
    _, _, preset = delta
    patch = pytest.MonkeyPatch()
    patch.setenv("TPU_MULTIHOST_BACKEND", "ray")
    patch.setenv("RAY_ADDRESS", cluster)
    patch.setenv("KERAS_VLLM_PRESET", preset)
    patch.setenv("KERAS_VLLM_PUBLIC_KEY", keys[1])
    # The tests read the workers' INFO lines ("Init mesh"); a quiet engine
    # started earlier in this process leaves WARNING in the environment
    # (`keras_vllm.logs`), which the server would inherit (seen in the full
    # suite, not in this module alone).
    patch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    try:
        yield patch
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def delta_server(head_environment, delta, tmp_path_factory):
    """`vllm serve DELTA --tensor-parallel-size 2` across the nodes."""
    _, path, _ = delta
    log = tmp_path_factory.mktemp("serve_log") / "server.log"
    server = running_server(
        [VLLM, "serve", path, "--tensor-parallel-size", "2",
         *engine_shapes.SERVE_ARGS], log, timeout=400)
    url = server.__enter__()
    _RUNNING.append(lambda: server.__exit__(None, None, None))
    yield url, path, log, head_environment
    _free_the_cluster()


# A second engine across the nodes, behind `vllm serve` (3-4 minutes of CI on
# 2 cores): the CI tier serves across the nodes through `from_export` above;
# this case is in `-m matrix` (docs/TESTING.md).
@pytest.mark.matrix
def test_vllm_serve_of_a_delta_across_nodes_equals_generate(
        delta_server, delta):
    url, path, log, _ = delta_server
    tuned = delta[0]
    prompts = testing.prompts()
    response = requests.post(url + "/v1/completions", json={
        "model": path, "prompt": prompts, "max_tokens": 16,
        "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
    }, timeout=120)
    assert response.status_code == 200, response.text
    ids = [reference.prompt_token_ids(tuned, t) for t in prompts]
    wants = reference.greedy_batch(tuned, ids, 16, [])
    for choice in response.json()["choices"]:
        assert choice["token_ids"] == wants[choice["index"]]
    # The changed variable matters: the preset alone answers otherwise.
    assert reference.greedy_batch(trained("llama"), ids, 16, []) != wants
    # One worker per node, each with the two-process mesh.
    text = log.read_text()
    workers = {line.split("pid=")[1].split(")")[0]
               for line in text.splitlines()
               if "RayWorkerProc" in line and "Init mesh" in line
               and "'model': 2" in line}
    assert len(workers) == 2, text[-3000:]


# A second `vllm serve` across the nodes, refused (about 2 minutes of CI on 2
# cores): the CI tier checks that a worker verifies with its own host's key
# and refuses a mismatch (tests/signing/test_signing.py); this case, the
# same on node 2 of a cluster, is in `-m matrix`.
@pytest.mark.matrix
def test_a_key_that_does_not_match_on_node_2_is_refused_there(
        head_environment, delta, keys):
    """Node 2's own public key is not the signer's: its worker refuses the
    artifact before reading it, and the engine does not start."""
    _, path, _ = delta
    _free_the_cluster()
    _, public, node2_public = keys
    with open(node2_public, "wb") as f:
        other = ec.generate_private_key(ec.SECP256R1())
        f.write(other.public_key().public_bytes(
            serialization.Encoding.PEM,
            serialization.PublicFormat.SubjectPublicKeyInfo))
    run = subprocess.run(
        [VLLM, "serve", path, "--tensor-parallel-size", "2",
         *engine_shapes.SERVE_ARGS, "--port", str(ray_cluster.free_port())],
        capture_output=True, text=True, timeout=400)
    assert run.returncode != 0
    log = run.stdout + run.stderr
    refused = [line for line in log.splitlines()
               if "SignatureError" in line and "does not verify" in line]
    assert refused, log[-5000:]
    # Node 2's worker, with node 2's key, named the artifact.
    assert all(node2_public in line and path in line for line in refused)
    assert public not in "".join(refused)
