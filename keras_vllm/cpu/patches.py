"""Run-time patches that let vllm-tpu 0.32.0 + tpu-inference 0.32.0 serve on
JAX CPU devices.

Neither package has a CPU mode. Without these patches an engine on a CPU-only
host fails, in this order (tpu-inference 0.32.0, jax 0.11.2):

1. `tpu_worker.init_device` -> `utils.hbm_usage_bytes`: CPU devices report no
   `memory_stats()`, and the fallback asks `get_device_hbm_limit()`, which
   raises `RuntimeError: Expected TPU devices`. `TpuPlatform.mem_get_info`
   subscripts `memory_stats()` (None on CPU).
2. `tpu_runner._create_2d_mesh` -> `utils.make_optimized_mesh` sorts devices
   by `.coords`, a TPU-only attribute (`AttributeError`).
3. Every attention layer calls the RPA v3 Pallas kernels, which raise
   `ValueError: Unsupported TPU device kind: cpu` in `pltpu.get_tpu_info()`.
4. `jax.jit(..., compiler_options=get_step_fn_compiler_options())` and
   `@jax.jit(compiler_options=get_sampling_compiler_options())` (bound at
   import in `layers/jax/sample/sampling.py`) pass XLA:TPU flags, and the CPU
   compiler rejects them: `INVALID_ARGUMENT: No such compile option:
   'xla_tpu_all_gather_collective_matmul_mode'`.
5. On CPU, `jax.device_put` of an aligned numpy array aliases it; the runner
   reuses one host buffer for every step's inputs, so with vLLM 0.32's
   default async scheduling a step can read the next step's inputs (wrong
   greedy tokens in a fraction of requests). `_patch_host_to_device_copies`
   copies instead; see `disable_async_scheduling_if_cpu`.
6. Linear-attention (Gated DeltaNet) layers call
   `GDNLinearAttentionBackend.conv1d_gdn_kernel()`, the GDN v3 Pallas kernel;
   `_patch_gdn_kernel` gives the portable `keras_vllm.layers.common.gated_delta_rule`
   on CPU.
7. With `TPU_MULTIHOST_BACKEND=ray`, nothing joins the Ray workers' JAX
   processes into one program (libtpu does it on a TPU slice):
   `keras_vllm/cpu/multihost.py`.

Every patch keeps the original behaviour for non-CPU devices: each replaced
function checks the devices it is about to use and delegates to the original
on a TPU. That matters because `apply_patches()` runs from a
`vllm.general_plugins` entry point, which vLLM also runs in the parent
process (`EngineArgs.__post_init__`) before it forks the EngineCore: JAX must
not be initialized there (a forked child aborts if it was), so the patches
cannot ask JAX which devices exist when they are installed.
"""

import logging
import warnings

from keras_vllm import envs
from keras_vllm import patching
from keras_vllm.cpu import buckets
from keras_vllm.cpu import detect
from keras_vllm.cpu import kv_capacity
from keras_vllm.cpu import memory
from keras_vllm.cpu import ragged_paged_attention as cpu_rpa
from keras_vllm.cpu.device_checks import all_cpu as _all_cpu
from keras_vllm.cpu.device_checks import jax_initialized as _jax_initialized

logger = logging.getLogger("keras_vllm")

_applied = False


def apply_patches():
    """Installs the CPU patches into tpu-inference, vLLM's platform and JAX.

    Idempotent. Safe to call before JAX is initialized (it does not
    initialize it). If JAX is already initialized with any non-CPU device,
    it does nothing.

    Raises:
        ServingError: the installed vllm-tpu / tpu-inference are not the
            pinned versions (`keras_vllm.patching.check_versions`).
    """
    global _applied
    if _applied:
        return
    patching.check_versions()
    if _jax_initialized() and not _all_cpu():
        logger.info("keras-vllm: JAX has non-CPU devices; CPU patches skipped.")
        return
    memory.patch_memory_accounting()
    kv_capacity.patch_kv_capacity()
    _patch_mesh()
    _patch_attention_kernels()
    _patch_gdn_kernel()
    _patch_compiler_options()
    _patch_host_to_device_copies()
    _patch_async_scheduling()
    if envs.TPU_MULTIHOST_BACKEND.raw() == "ray":
        # Imported only then: the executor's module imports Ray.
        from keras_vllm.cpu import multihost

        multihost.install()
    # XLA:CPU cannot reuse donated buffers; tpu-inference donates them for
    # TPU, so every compile on CPU would warn.
    warnings.filterwarnings(
        "ignore", message="Some donated buffers were not usable"
    )
    _applied = True
    logger.info("keras-vllm: CPU patches for tpu-inference %s applied.",
                patching.PINNED_VERSIONS["tpu-inference"])


def disable_async_scheduling_if_cpu(vllm_config):
    """Turns vLLM's async scheduling off on CPU if the user asks for it.

    With vLLM 0.32's default `async_scheduling=True`, greedy outputs on JAX
    CPU devices used to be nondeterministically wrong for some batches (94
    of 588 requests in one measurement; a whole batch diverging at the same
    decode step). The cause: on CPU, `jax.device_put` of an aligned numpy
    array aliases it, and the runner refills its one reused host buffer
    for step N+1 while step N may still read it. `_patch_host_to_device_copies`
    fixes that (a probe forcing the aliasing went from 4/48 wrong to 0/48;
    64 distinct prompts x 4 rounds x 32 tokens with async scheduling on:
    0/256 wrong), so vLLM's default is kept. `KERAS_VLLM_CPU_ASYNC_SCHEDULING=0`
    turns it off.

    Args:
        vllm_config: the `VllmConfig` being finalized.
    """
    scheduler_config = getattr(vllm_config, "scheduler_config", None)
    if scheduler_config is None or not detect.is_cpu_host():
        return
    if envs.CPU_ASYNC_SCHEDULING.get():
        return
    if scheduler_config.async_scheduling:
        scheduler_config.async_scheduling = False
        logger.warning(
            "keras-vllm: async scheduling disabled on CPU (%s=0).",
            envs.CPU_ASYNC_SCHEDULING.name)


# ---------------------------------------------------------------------------
# 2. Device mesh (tpu_inference/utils.py make_optimized_mesh, imported by
#    name into runner/tpu_runner.py).
# ---------------------------------------------------------------------------


def _patch_mesh():
    import tpu_inference.utils as ti_utils

    patching.replace(ti_utils, "make_optimized_mesh", _mesh_on_cpu,
                     everywhere="tpu_inference")


def _mesh_on_cpu(original):

    def make_optimized_mesh(axis_shapes, axis_names, *, devices=None):
        """CPU: devices in their given order (no `.coords`); else original.

        A plain `Mesh` keeps `Auto` axis types: `jax.make_mesh` would make
        them `Explicit`, and tpu-inference's embedding gather then fails with
        a `ShardingTypeError`.
        """
        import jax
        import numpy as np
        candidates = list(jax.devices() if devices is None else devices)
        if not _all_cpu(candidates):
            return original(axis_shapes, axis_names, devices=devices)
        count = int(np.prod(axis_shapes))
        grid = np.array(candidates[:count]).reshape(tuple(axis_shapes))
        return jax.sharding.Mesh(grid, tuple(axis_names))

    return make_optimized_mesh


# ---------------------------------------------------------------------------
# 3. Attention kernels (kernels/ragged_paged_attention/v3/kernel.py and
#    kernel_hd64.py; bound by name in layers/common/attention_interface.py
#    and some layers/jax/attention modules).
# ---------------------------------------------------------------------------


def _patch_attention_kernels():
    from tpu_inference.kernels.ragged_paged_attention.v3 import \
        kernel as rpa
    from tpu_inference.kernels.ragged_paged_attention.v3 import \
        kernel_hd64 as rpa_hd64

    for module, name, cpu_kernel in (
        (rpa, "ragged_paged_attention", cpu_rpa.ragged_paged_attention),
        (rpa_hd64, "ragged_paged_attention_hd64",
         cpu_rpa.ragged_paged_attention_hd64),
    ):
        patching.replace(
            module, name,
            lambda original, cpu=cpu_kernel: _kernel_dispatcher(original, cpu),
            everywhere="tpu_inference",
        )


def _kernel_dispatcher(tpu_kernel, cpu_kernel):
    """A kernel that runs `cpu_kernel` when JAX computes on CPU.

    The choice is made at trace time from JAX's default backend (inside
    `shard_map` the operands are tracers and carry no device).
    """

    def kernel(*args, **kwargs):
        import jax
        if jax.default_backend() == "cpu":
            return cpu_kernel(*args, **kwargs)
        return tpu_kernel(*args, **kwargs)

    kernel.__name__ = tpu_kernel.__name__
    kernel.__doc__ = (f"CPU-aware `{tpu_kernel.__name__}` (keras-vllm): "
                      f"the pure-JAX kernel on CPU, the Pallas kernel on TPU.")
    return kernel


def _patch_gdn_kernel():
    """`GDNLinearAttentionBackend.conv1d_gdn_kernel` (tpu-inference 0.32.0,
    layers/common/attention_backend.py) returns the Pallas GDN v3 kernel,
    which fails on CPU like the RPA kernels (item 6 above)."""
    from tpu_inference.layers.common.attention_backend import \
        GDNLinearAttentionBackend

    from keras_vllm.layers.common import gated_delta_rule

    def cpu_aware(original):
        def conv1d_gdn_kernel(self):
            import jax
            if jax.default_backend() == "cpu":
                return gated_delta_rule.conv1d_gdn
            return original(self)

        return conv1d_gdn_kernel

    patching.replace(GDNLinearAttentionBackend, "conv1d_gdn_kernel",
                     cpu_aware)


# ---------------------------------------------------------------------------
# 4. XLA:TPU-only compiler options (models/common/compiler_options.py, bound
#    by name in model_loader, vllm_model_wrapper, decode_loop, sampling; and
#    JAX's compile-option builder for options already baked into decorators).
# ---------------------------------------------------------------------------


def _patch_compiler_options():
    from tpu_inference.models.common import compiler_options

    for name in ("get_step_fn_compiler_options",
                 "get_sampling_compiler_options"):
        patching.replace(compiler_options, name, _cpu_empty_options,
                         everywhere="tpu_inference")
    _patch_jax_compile_options()


def _cpu_empty_options(original):

    def options():
        # Asked at import too (tpu-inference's sampling module): JAX must
        # not start then, since a multi-host worker joins JAX's distributed
        # runtime later (cpu/multihost.py). Before JAX starts, the CPU host
        # check (environment and device files only) says where it will run.
        on_cpu = _all_cpu() if _jax_initialized() else detect.is_cpu_host()
        if on_cpu:
            return {}
        return original()

    options.__name__ = original.__name__
    options.__doc__ = f"`{original.__name__}`, but {{}} on CPU (keras-vllm)."
    return options


def _patch_jax_compile_options():
    """Drops `xla_tpu_*` overrides when JAX compiles for CPU (jax 0.11.2,
    `jax._src.compiler.get_compile_options`, called by `pxla` with the
    `compiler_options` of `jax.jit`)."""
    from jax._src import compiler

    def without_tpu_options(original):
        def get_compile_options(*args, **kwargs):
            overrides = kwargs.get("env_options_overrides")
            backend = kwargs.get("backend")
            if overrides and backend is not None and backend.platform == "cpu":
                kwargs["env_options_overrides"] = {
                    key: value for key, value in overrides.items()
                    if not key.startswith("xla_tpu_")
                }
            return original(*args, **kwargs)

        return get_compile_options

    patching.replace(compiler, "get_compile_options", without_tpu_options)


# ---------------------------------------------------------------------------
# 5. Host-to-device copies (layers/common/utils.py general_device_put, which
#    utils.device_array and the runner use to upload every step's inputs).
# ---------------------------------------------------------------------------


def _patch_host_to_device_copies():
    """Makes uploads of numpy buffers real copies on CPU.

    On CPU, `jax.device_put` of a 64-byte-aligned numpy array is zero-copy:
    the "device" array aliases the numpy memory (jax 0.11.2; measured). The
    tpu-inference runner packs every step's inputs (token ids, positions,
    sequence lengths, query offsets, page tables) into one persistent numpy
    buffer (`DeviceBuffer`) and uploads it with `device_array`. With async
    scheduling the host refills that buffer for step N+1 while step N, which
    may still alias it, has not run yet, so step N computes on step N+1's
    inputs. Whether the buffer happens to be 64-byte aligned depends on the
    allocator, which is why the wrong tokens came and went between runs. On
    TPU the upload is a real copy, so only CPU needs this.
    """
    from tpu_inference.layers.common import utils as common_utils

    def copying_on_cpu(original):
        def general_device_put(tensor, sharding, **kwargs):
            import jax
            import numpy as np
            # A bare `PartitionSpec` (tpu-inference's MTP proposer uploads
            # with one) places on the enclosing mesh: this host's CPUs.
            devices = getattr(sharding, "device_set", None)
            if devices is None or _all_cpu(devices):
                tensor = jax.tree.map(
                    lambda t: np.array(t, copy=True)
                    if isinstance(t, np.ndarray) else t, tensor)
            return original(tensor, sharding, **kwargs)

        general_device_put.__doc__ = original.__doc__
        return general_device_put

    patching.replace(common_utils, "general_device_put", copying_on_cpu,
                     everywhere="tpu_inference")


# ---------------------------------------------------------------------------
# 6. Async scheduling (TpuPlatform.check_and_update_config, which vLLM 0.32
#    calls after resolving async scheduling and treats as the last word).
# ---------------------------------------------------------------------------


def _patch_async_scheduling():
    from tpu_inference.platforms.tpu_platform import TpuPlatform

    patching.replace(TpuPlatform, "check_and_update_config",
                     _cpu_config_checks)


def _cpu_config_checks(original_method):
    original = original_method.__func__

    def check_and_update_config(cls, vllm_config):
        # Before the original: it may be the last call before vLLM starts
        # the engine process, which must inherit the device count.
        if detect.is_cpu_host():
            from keras_vllm.cpu import devices

            parallel = vllm_config.parallel_config
            devices.request_devices(
                parallel.tensor_parallel_size * parallel.data_parallel_size,
                engine_in_this_process=not envs.ENABLE_V1_MULTIPROCESSING.get(),
            )
        original(cls, vllm_config)
        disable_async_scheduling_if_cpu(vllm_config)
        if detect.is_cpu_host():
            buckets.add_one_token_bucket(vllm_config)

    return classmethod(check_and_update_config)
