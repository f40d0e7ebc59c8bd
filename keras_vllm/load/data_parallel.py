"""Which data-parallel settings an artifact can be served with.

tpu-inference 0.32 serves `data_parallel_size=N` as one engine over a
`(data, model)` mesh of N x TP devices: its `DPScheduler` keeps one vLLM
scheduler (and one block of KV-cache pages) per replica and places each
request on one replica for its lifetime; the runner lays the replicas'
batches out one after the other along the mesh's `data` axis. (keras-vllm
keeps it in that single-engine mode for `vllm serve` too: see
`keras_vllm/_env.py`.) What does not work there is refused before vLLM
starts, here, from the engine keyword arguments alone (no JAX, no model):

- a size that is not a positive integer;
- a size that is not a power of two: the runner pads each step's requests
  and tokens to powers of two (8, 16, ...) and splits them evenly over the
  replicas; at 3 its own warm-up failed (`CompilationManager.
  _precompile_sampling`: `IndivisibleError`, 8 rows over 3 devices);
- LoRA adapters: tpu-inference refuses LoRA with data parallelism
  (`ShardingConfigManager.validate`), after vLLM has started.

Structured outputs are per request: a data-parallel engine refuses each
structured request (`keras_vllm.serve.frontend.sampling`).
"""

from keras_vllm.errors import ServingError


def _replicas(value, where):
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1 or str(size) != str(value).strip():
        raise ServingError(
            f"data_parallel_size={value!r} cannot serve {where}: it is the "
            "number of model replicas, an integer of at least 1."
        )
    return size


def check_data_parallel(kwargs, where):
    """Refuses data-parallel settings the engine cannot serve.

    Args:
        kwargs: the `vllm.LLM` keyword arguments (`data_parallel_size`,
            `enable_lora`, ...).
        where: the artifact, as the message names it.

    Returns:
        The number of replicas.

    Raises:
        ServingError: naming the setting and what to do instead.

    Example:

    ```python
    check_data_parallel({"data_parallel_size": 2}, "exports/tuned")  # 2
    ```
    """
    replicas = _replicas(kwargs.get("data_parallel_size", 1), where)
    if replicas & (replicas - 1):
        sizes = ", ".join(str(2 ** i) for i in range(7))
        raise ServingError(
            f"data_parallel_size={replicas} cannot serve {where}: vLLM's TPU "
            "backend (tpu-inference 0.32) pads every step's requests to a "
            "power of two and splits them evenly over the replicas, so the "
            f"size must be a power of two ({sizes}, ...)."
        )
    if replicas > 1 and kwargs.get("enable_lora"):
        raise ServingError(
            f"data_parallel_size={replicas} cannot serve {where} with LoRA "
            "adapters: vLLM's TPU backend (tpu-inference 0.32) serves LoRA "
            "on one replica only. Serve the adapters from an engine with "
            "data_parallel_size=1, or serve one adapter artifact by itself "
            "(`from_export(adapter, data_parallel_size=N)` merges it into "
            "its base at load)."
        )
    return replicas
