"""CPU patch: the KV cache holds what the engine can use, not the budget.

vLLM sizes the KV cache from free accelerator memory (on CPU, the fake
budget of `cpu/memory.py`: `KERAS_VLLM_CPU_MEMORY_GB` x
`gpu_memory_utilization`, 3.6 GiB by default) and tpu-inference fills it
with zeros before the engine serves. Fresh host memory is slow to fault in
(about 0.6 GB/s on the 2-core CI host): that fill was ~9.5 s of every CPU
engine start, cold or warm, for a cache the engine could never fill. An
engine never holds more than `max_num_seqs` sequences of `max_model_len`
tokens at once, so on a CPU host the memory vLLM plans the cache with is
capped at that many blocks (plus one block of slack per sequence), within
the budget as before.

Patched: `vllm.v1.executor.abstract.Executor.determine_available_memory`
(vllm-tpu 0.32.0), which every executor inherits or calls through `super()`.
vLLM imports it in every process already, so the patch costs no import; a
TPU host keeps the original.
"""

import logging

from keras_vllm import patching
from keras_vllm.cpu import detect

logger = logging.getLogger("keras_vllm")


def blocks_needed(max_num_seqs, max_model_len, block_size):
    """KV blocks for `max_num_seqs` sequences of `max_model_len` tokens.

    Example:

    >>> blocks_needed(16, 256, 128)
    48
    """
    per_sequence = -(-int(max_model_len) // int(block_size)) + 1
    return int(max_num_seqs) * per_sequence


def bytes_needed(kv_cache_specs, max_num_seqs, max_model_len):
    """Bytes of KV cache an engine can use at once: every layer's pages.

    Args:
        kv_cache_specs: `{layer name: vLLM KVCacheSpec}` of one worker.
        max_num_seqs: the scheduler's `max_num_seqs`.
        max_model_len: the model config's `max_model_len`.
    """
    return sum(
        blocks_needed(max_num_seqs, max_model_len, spec.block_size)
        * int(spec.page_size_bytes)
        for spec in kv_cache_specs.values()
    )


def capped(available, kv_cache_specs, vllm_config):
    """Each worker's available bytes, capped at what its cache can hold.

    Args:
        available: bytes per worker, as the workers measured them.
        kv_cache_specs: `{layer name: KVCacheSpec}` per worker.
        vllm_config: the engine's `VllmConfig`.
    """
    seqs = vllm_config.scheduler_config.max_num_seqs
    length = vllm_config.model_config.max_model_len
    result = []
    for free, specs in zip(available, kv_cache_specs):
        needed = bytes_needed(specs, seqs, length)
        result.append(needed if 0 < needed < free else free)
    if result != list(available):
        logger.debug(
            "keras-vllm: CPU KV cache planned for %d sequences x %d tokens: "
            "%s bytes instead of %s.", seqs, length, result, list(available),
        )
    return result


def patch_kv_capacity():
    """Caps the KV memory a CPU engine plans with at what it can use."""
    from vllm.v1.executor.abstract import Executor

    def capped_on_cpu(original):
        def determine_available_memory(self):
            available = original(self)
            if not detect.is_cpu_host():
                return available
            return capped(
                available, self.get_kv_cache_specs(), self.vllm_config
            )

        return determine_available_memory

    patching.replace(
        Executor, "determine_available_memory", capped_on_cpu
    )
