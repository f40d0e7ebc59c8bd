"""Methods keras-vllm adds to vLLM's worker (`--worker-extension-cls`).

vLLM appends this class to its worker class's bases in every worker
process, so `llm.collective_rpc("keras_vllm_weights")` reaches the serving
model wherever the engine runs (a forked or spawned engine process, or
in-process) and returns only plain values, which cross process boundaries
without vLLM's insecure serialization.
"""

WORKER_EXTENSION = "keras_vllm.load.worker_extension.KerasVllmWorkerExtension"


class KerasVllmWorkerExtension:
    """Mixed into vLLM's worker (tpu-inference's `TPUWorker`)."""

    def keras_vllm_weights(self):
        """How the served weights lie on the devices.

        Returns:
            A dict: `"devices"`, bytes of model state held by each device
            (in mesh order); `"variables"`, `{path: {"shape", "dtype",
            "spec", "bytes"}}` with `spec` the partition spec as a list of
            mesh axis names (None for an unsplit axis).
        """
        import jax

        runner = self.model_runner
        devices = list(runner.mesh.devices.flat)
        held = {device: 0 for device in devices}
        variables = {}
        flat = jax.tree_util.tree_flatten_with_path(runner.state)[0]
        for key_path, leaf in flat:
            if not isinstance(leaf, jax.Array):
                continue
            for shard in leaf.addressable_shards:
                if shard.device in held:
                    held[shard.device] += shard.data.nbytes
            spec = getattr(leaf.sharding, "spec", None)
            variables[_path(key_path)] = {
                "shape": list(leaf.shape),
                "dtype": str(leaf.dtype),
                "spec": [_axis(a) for a in spec] if spec is not None else [],
                "bytes": int(leaf.nbytes),
            }
        return {
            "devices": [held[device] for device in devices],
            "variables": variables,
        }


def _axis(axis):
    if axis is None or isinstance(axis, str):
        return axis
    return "+".join(axis)


def _path(key_path):
    """A state path as `backbone/.../kernel` (nnx keys, no value suffix)."""
    parts = []
    for key in key_path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))
        parts.append(str(name))
    if parts and parts[-1] in ("value", "raw_value"):
        parts.pop()
    return "/".join(parts)
