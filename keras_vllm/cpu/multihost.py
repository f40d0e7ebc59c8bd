"""Multi-host serving on JAX CPU devices through vLLM's Ray executor.

tpu-inference 0.32's multi-host path (`TPU_MULTIHOST_BACKEND=ray`; vLLM
0.32's default `VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1` selects
`executors/ray_distributed_executor_v2.py::RayDistributedExecutorV2`) starts
one Ray worker per node, holding that node's chips, and relies on the TPU
runtime to join the hosts into one JAX program: on a TPU slice libtpu
learns its peers from the slice's environment, and no worker calls
`jax.distributed.initialize`. JAX CPU devices have no such runtime: each
worker's JAX would see only its own process's devices, and
`TPUWorker.init_device` would take `jax.devices()[:TP]` from one process
(a TP=2 engine over two one-device nodes gets a mesh of one device).

Two replacements make the CPU backend join the hosts the way libtpu does,
with JAX's distributed runtime and its default Gloo CPU collectives:

- `WorkerWrapperBase.init_device`, vLLM's call of `TPUWorker.init_device`
  (the first call that starts JAX in a worker): before the original, the
  worker sets its CPU device count to the chips its Ray actor holds (the
  node's Ray `TPU` resource) and joins JAX's distributed runtime as process
  `rank` (its vLLM rank: one worker per node, the driver's node first) of as
  many processes as its placement group has bundles (one per node). Rank 0
  picks a free port on its host for JAX's coordinator and publishes it in
  the TCP store the executor started on rank 0 for vLLM's own process group
  (`distributed_init_method`; tpu-inference's workers never use it), where
  the others read it. `jax.devices()` then lists every node's devices in
  process order, and the original takes the mesh's devices across the
  nodes as on a TPU slice;
- `distributed/utils.py::get_device_topology_order_id`, which orders hosts
  by their TPU chips' `.coords`: on CPU, a host's order is its JAX process
  index.

Both check for CPU first and otherwise run the original, so a TPU slice is
untouched. vLLM's older Ray executor (`VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`)
gives every worker rank 0 when pipeline parallelism is 1, so a worker could
not tell which process it is: it is refused on CPU, by name.
"""

import logging

from keras_vllm import envs
from keras_vllm import patching
from keras_vllm.cpu import detect
from keras_vllm.cpu import devices as cpu_devices

logger = logging.getLogger("keras_vllm")

# How long JAX's distributed runtime and the port hand-over wait for every
# process to join.
_JOIN_TIMEOUT_S = 300
# The TCP store key under which rank 0 publishes JAX's coordinator address.
_COORDINATOR_KEY = "keras_vllm/jax_coordinator"


def install():
    """Installs both replacements; idempotent.

    Raises:
        ConfigurationError: vLLM's older Ray executor is selected
            (`VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`).
    """
    import vllm.envs as vllm_envs

    if not vllm_envs.VLLM_USE_RAY_V2_EXECUTOR_BACKEND:
        from keras_vllm.errors import ConfigurationError

        raise ConfigurationError(
            "Multi-host serving on CPU (TPU_MULTIHOST_BACKEND=ray) needs "
            "vLLM's Ray executor V2: VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 gives "
            "every worker rank 0, so none can tell which JAX process it is. "
            "Unset VLLM_USE_RAY_V2_EXECUTOR_BACKEND (vLLM's default is 1).")
    import tpu_inference.distributed.utils as distributed_utils
    # vLLM's wrapper, not `TPUWorker` itself: importing tpu-inference's
    # worker module here would start JAX (its sampling module computes
    # compiler options at import), and the runtime must be joined first.
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    patching.replace(WorkerWrapperBase, "init_device", _joining_jax_processes)
    patching.replace(distributed_utils, "get_device_topology_order_id",
                     _process_order_on_cpu, everywhere="tpu_inference")


def _joining_jax_processes(original):

    def init_device(self, *args, **kwargs):
        """Joins JAX's distributed runtime first on a multi-host CPU run."""
        worker = self.worker
        if detect.is_cpu_host():
            _join(worker.rank, worker.distributed_init_method)
        return original(self, *args, **kwargs)

    init_device.__doc__ = original.__doc__
    return init_device


def _process_order_on_cpu(original):

    def get_device_topology_order_id(local_devices, global_devices):
        """CPU: the local devices' JAX process index; else the original."""
        local_devices = list(local_devices)
        if local_devices and all(d.platform == "cpu" for d in local_devices):
            return local_devices[0].process_index
        return original(local_devices, global_devices)

    return get_device_topology_order_id


def _process_count():
    """The Ray workers of this engine: one per placement group bundle."""
    import ray

    group = ray.util.get_current_placement_group()
    if group is None:
        raise RuntimeError("keras-vllm: a Ray worker outside a placement group")
    return group.bundle_count


def _chips():
    """The chips this worker's Ray actor holds: its share of the node's
    `TPU` resource (all of it: one worker per node)."""
    import ray
    from vllm.platforms import current_platform

    assigned = ray.get_runtime_context().get_assigned_resources()
    return max(1, int(assigned.get(current_platform.ray_device_key, 1)))


def _coordinator(rank, distributed_init_method):
    """JAX's coordinator `host:port`, chosen by rank 0 and shared through
    the executor's TCP store."""
    import datetime

    from torch.distributed import TCPStore
    from vllm.utils.network_utils import get_open_port

    host, _, port = distributed_init_method.removeprefix(
        "tcp://").rpartition(":")
    store = TCPStore(host, int(port), is_master=False,
                     timeout=datetime.timedelta(seconds=_JOIN_TIMEOUT_S))
    if rank == 0:
        store.set(_COORDINATOR_KEY, f"{host}:{get_open_port()}")
    return store.get(_COORDINATOR_KEY).decode()


def _join(rank, distributed_init_method):
    import jax
    from jax._src import distributed

    if distributed.global_state.client is not None:
        return  # joined already (init_device called again)
    count = _process_count()
    coordinator = _coordinator(rank, distributed_init_method)
    local = _chips()
    envs.XLA_FLAGS.set(cpu_devices.with_device_count(envs.XLA_FLAGS.raw(),
                                                     local))
    cpu_devices.pin_imported_jax_to_cpu()
    jax.config.update("jax_num_cpu_devices", local)
    logger.info("keras-vllm: JAX process %d of %d on CPU (%d local devices), "
                "coordinator %s.", rank, count, local, coordinator)
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=count,
        process_id=rank,
        initialization_timeout=_JOIN_TIMEOUT_S,
    )
