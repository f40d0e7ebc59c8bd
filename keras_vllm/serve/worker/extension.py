"""Methods keras-vllm adds to vLLM's worker (`--worker-extension-cls`).

vLLM appends this class to its worker class's bases in every worker
process, so `llm.collective_rpc("keras_vllm_weights")` reaches the serving
model wherever the engine runs (a forked or spawned engine process, or
in-process) and returns only plain values, which cross process boundaries
without vLLM's insecure serialization.
"""

import os

# Backend compiles counted by `keras_vllm_compiles` (None: not listening).
_COMPILES = None

WORKER_EXTENSION = "keras_vllm.serve.worker.extension.KerasVllmWorkerExtension"


class KerasVllmWorkerExtension:
    """Mixed into vLLM's worker (tpu-inference's `TPUWorker`)."""

    def keras_vllm_update_from_artifact(self, path, preset=None,
                                        public_key=None, manifest_hash=None):
        """Replaces the served weights with a verified artifact's.

        `KerasVllmEngine.update_weights(path)` calls this after its own
        checks; the artifact is verified again here, where it is read, and
        must still be the one checked (`manifest_hash`).

        Returns:
            `{"variables", "bytes", "seconds"}`.
        """
        from keras_vllm.serve.worker.lora_manager import KerasLoraManager
        from keras_vllm.serve.worker import weight_update

        model = self.model_runner.model
        opened = weight_update.open_update(
            os.path.abspath(path), public_key, manifest_hash
        )
        manager = getattr(self.model_runner, "lora_manager", None)
        if isinstance(manager, KerasLoraManager):
            # Adapters held now must fit the new base (refused otherwise).
            manager.check_new_base(opened)
        incoming = weight_update.artifact_values(
            opened, model.backbone, model.dtype_name, preset
        )
        result = weight_update.replace_weights(
            self, incoming, f"The export '{path}'"
        )
        # Adapters loaded from now on are checked against the base served.
        model.artifact = opened
        return result

    def keras_vllm_update_from_values(self, values):
        """Replaces the served weights with live arrays (in-process engines
        only: the arguments are the caller's own objects).

        Args:
            values: `[(variable, value)]` from
                `keras_vllm.hub.weights.backbone_values`.

        Returns:
            `{"variables", "bytes", "seconds"}`.
        """
        from keras_vllm.serve.worker import weight_update

        return weight_update.replace_weights(self, values, "The Keras model")

    def keras_vllm_release_device_memory(self, weights=True):
        """Frees the engine's KV cache (and weights) on the devices now.

        `KerasVllmEngine.shutdown()` calls this for an engine in the
        caller's process. Dropping the engine's objects is not enough there:
        whatever still references them keeps their arrays on the device, and
        on a TPU the KV cache fills most of the chip, so the next engine in
        the process could not start ("total_hbm_used_gb ... exceeds"). Such
        references outlive the engine: a traceback kept for a debugger (an
        interactive session's last error, pytest's), and JAX's compilation
        caches, which hold tpu-inference's jitted runner methods' `self`
        (the runner, a static argument) until evicted.

        Args:
            weights: also delete the served weights' arrays (and a drafter's);
                False when they may be the caller's own arrays (after a
                live-model update).

        Returns:
            The bytes freed.
        """
        import jax

        def live(tree):
            # Checked as each leaf is reached: one held twice is freed once.
            for leaf in jax.tree_util.tree_leaves(tree):
                if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                    yield leaf

        runner = self.model_runner
        freed = sum(int(leaf.nbytes) for leaf in live(runner.kv_caches))
        runner.delete_kv_cache()
        if weights:
            # A drafter's own weights too (its leaves include the served
            # embedding where it shares it).
            drafter = getattr(runner, "drafter", None)
            held = (runner.state, getattr(drafter, "state_leaves", ()))
            for leaf in live(held):
                freed += int(leaf.nbytes)
                leaf.delete()
        return freed

    def keras_vllm_weights(self):
        """How the served weights lie on the devices.

        Returns:
            A dict: `"devices"`, bytes of model state held by each device
            (in mesh order); `"variables"`, `{path: {"shape", "dtype",
            "spec", "bytes"}}` with `spec` the partition spec as a list of
            mesh axis names (None for an unsplit axis).
        """
        import jax

        from keras_vllm.serve.worker import sharding

        runner = self.model_runner
        devices = list(runner.mesh.devices.flat)
        held = {device: 0 for device in devices}
        # Bytes from the state the jitted step runs on; names from the
        # Keras variables of the same model (nnx paths name attributes).
        for leaf in jax.tree_util.tree_leaves(runner.state):
            if isinstance(leaf, jax.Array):
                for shard in leaf.addressable_shards:
                    if shard.device in held:
                        held[shard.device] += shard.data.nbytes
        variables = {}
        for _, variable in sharding.owned_variables(runner.model.backbone):
            value = variable.value
            spec = getattr(value.sharding, "spec", None)
            variables[variable.path] = {
                "shape": list(value.shape),
                "dtype": str(value.dtype),
                "spec": [_axis(a) for a in spec] if spec is not None else [],
                "bytes": int(value.nbytes),
            }
        return {
            "devices": [held[device] for device in devices],
            "variables": variables,
        }

    def keras_vllm_kv_pages(self):
        """KV-cache pages holding data, per data-parallel replica.

        Each replica's KV cache is its own block of pages, the cache's
        slice along the mesh's `data` axis; a replica that served requests
        has written some of its pages. Read from the first layer's cache.

        Returns:
            A list, one count per replica (in mesh order).
        """
        import numpy as np
        from tpu_inference.layers.common.sharding import ShardingAxisName

        runner = self.model_runner
        mesh = runner.mesh
        data_axis = mesh.axis_names.index(ShardingAxisName.MLP_DATA)
        replica_of = {
            device: index[data_axis]
            for index, device in np.ndenumerate(mesh.devices)
        }
        pages = [0] * mesh.devices.shape[data_axis]
        for shard in runner.kv_caches[0].addressable_shards:
            block = np.asarray(shard.data)
            used = np.any(block.reshape(block.shape[0], -1) != 0, axis=1)
            replica = replica_of[shard.device]
            pages[replica] = max(pages[replica], int(used.sum()))
        return pages

    def keras_vllm_kv_caches(self):
        """The KV caches vLLM allocated and which attention layer uses each.

        Returns:
            A dict: `"shapes"`, the shape of each cache array (in vLLM's
            list order; a layer with a recurrent state has a list of its
            state arrays' shapes, each `[slots, *state shape]`);
            `"layers"`, `{"layer.{i}": cache index}` (layers that share a
            cache point at their source's).
        """
        runner = self.model_runner

        def shape(cache):
            if isinstance(cache, (tuple, list)):
                return [list(array.shape) for array in cache]
            return list(cache.shape)

        return {
            "shapes": [shape(cache) for cache in runner.kv_caches],
            "layers": dict(runner.layer_name_to_kvcache_index),
        }


    def keras_vllm_image_encoder(self, image_counts, repeats=5):
        """Times the served vision encoder alone (`bench.image_cost`).

        Calls the runner's own encoder entry (`embed_multimodal_fn` on the
        state the step runs on, as the runner does for a step's images) on
        zero pixels of the artifact's image size, `repeats` times per count
        after one warm call.

        Returns:
            `{"seconds": [median seconds per count], "programs": the
            encoder programs compiled so far (one per image count)}`.
        """
        import time

        import jax
        import numpy as np

        from keras_vllm import format as fmt

        runner = self.model_runner
        model = runner.model
        height, width = fmt.image_settings(model.artifact.manifest)[
            "converter"]["image_size"]
        seconds = []
        for count in image_counts:
            pixels = np.zeros((count, height, width, 3), "float32")
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                jax.block_until_ready(runner.embed_multimodal_fn(
                    runner.state_leaves, modality="image",
                    pixel_values=pixels,
                ))
                times.append(time.perf_counter() - start)
            seconds.append(float(np.median(times[1:])))
        return {"seconds": seconds, "programs": model.encoder_programs()}

    def keras_vllm_compiles(self):
        """XLA programs this worker compiled since its first call here
        (a JAX monitoring listener counts backend compiles; benchmarks)."""
        import jax

        global _COMPILES
        if _COMPILES is None:
            _COMPILES = [0]

            def listen(event, seconds, **kwargs):
                if event == "/jax/core/compile/backend_compile_duration":
                    _COMPILES[0] += 1

            jax.monitoring.register_event_duration_secs_listener(listen)
        return _COMPILES[0]

def _axis(axis):
    if axis is None or isinstance(axis, str):
        return axis
    return "+".join(axis)
