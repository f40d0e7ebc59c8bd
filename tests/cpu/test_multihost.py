"""The CPU backend's multi-host pieces that need no Ray cluster.

`tests/serve/test_multihost_ray.py` serves across two Ray nodes; these are
the parts it relies on that can fail by themselves: a Ray worker must be
able to import tpu-inference's worker module without starting JAX (it joins
JAX's distributed runtime afterwards), hosts are ordered by JAX process on
CPU, and vLLM's older Ray executor is refused by name.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def test_worker_imports_leave_jax_unstarted():
    """The plugin plus tpu-inference's worker module (what vLLM's
    `init_worker` imports) must not create JAX's backends."""
    script = textwrap.dedent("""
        from jax._src import xla_bridge
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import tpu_inference.worker.tpu_worker  # noqa: F401
        print("started" if xla_bridge.backends_are_initialized() else "not")
    """)
    env = dict(os.environ, TPU_MULTIHOST_BACKEND="ray",
               PYTHONPATH=os.pathsep.join(
                   [REPO, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "not"


def test_hosts_are_ordered_by_jax_process_on_cpu():
    import jax
    import tpu_inference.distributed.utils as distributed_utils

    from keras_vllm.cpu import multihost

    order = multihost._process_order_on_cpu(
        distributed_utils.get_device_topology_order_id)
    # The original reads TPU `.coords`, which CPU devices lack.
    assert order(jax.local_devices(), jax.devices()) == jax.process_index()


def test_the_older_ray_executor_is_refused_by_name(monkeypatch):
    from keras_vllm.cpu import multihost
    from keras_vllm.errors import ConfigurationError

    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "0")
    with pytest.raises(ConfigurationError,
                       match="VLLM_USE_RAY_V2_EXECUTOR_BACKEND"):
        multihost.install()
