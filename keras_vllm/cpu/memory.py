"""CPU patch 1: HBM accounting (tpu_inference/utils.py `hbm_usage_bytes`,
platforms/tpu_platform.py `TpuPlatform.mem_get_info`).

CPU devices report no `memory_stats()`; vLLM sizes the KV cache from a fake
budget instead (`KERAS_VLLM_CPU_MEMORY_GB`, the host's, split over its
devices).
"""

from keras_vllm import envs
from keras_vllm.cpu.device_checks import all_cpu as _all_cpu
from keras_vllm import patching

_GIB = 1 << 30


def _memory_budget_bytes():
    # vLLM sizes the KV cache from this fake HBM budget per CPU device:
    # gpu_memory_utilization x budget - memory in use. Virtual CPU devices
    # share one host's memory, so the host's budget is split over them (a
    # TP=4 engine must not allocate four times a TP=1 engine's cache).
    import jax
    return int(envs.CPU_MEMORY_GB.get() * _GIB) // max(1, len(jax.devices()))


def _live_bytes_per_device(devices):
    """Bytes held by live JAX arrays on each of `devices`."""
    import jax
    used = {d: 0 for d in devices}
    seen = set()
    for array in jax.live_arrays():
        for shard in array.addressable_shards:
            buffer = shard.data
            if id(buffer) in seen or buffer.device not in used:
                continue
            seen.add(id(buffer))
            used[buffer.device] += buffer.nbytes
    return [used[d] for d in devices]


def patch_memory_accounting():
    import tpu_inference.utils as ti_utils
    from tpu_inference.platforms.tpu_platform import TpuPlatform

    def usage_on_cpu(original_usage):
        def hbm_usage_bytes(devices):
            """CPU: (live-array bytes, fake budget) per device; else original."""
            devices = list(devices)
            if not _all_cpu(devices):
                return original_usage(devices)
            limit = _memory_budget_bytes()
            return [(used, limit) for used in _live_bytes_per_device(devices)]

        return hbm_usage_bytes

    hbm_usage_bytes = patching.replace(
        ti_utils, "hbm_usage_bytes", usage_on_cpu, everywhere="tpu_inference"
    )

    def info_on_cpu(original):
        original_mem_get_info = original.__func__

        def mem_get_info(cls):
            """CPU: (free, total) summed over local devices, like the original."""
            import jax
            devices = jax.local_devices()
            if not _all_cpu(devices):
                return original_mem_get_info(cls)
            usage = hbm_usage_bytes(devices)
            total = sum(limit for _, limit in usage)
            return total - sum(used for used, _ in usage), total

        return classmethod(mem_get_info)

    patching.replace(TpuPlatform, "mem_get_info", info_on_cpu)
