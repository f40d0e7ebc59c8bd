"""Replacing the served weights of a running engine, in vLLM's worker.

The jitted step takes the served backbone's variables as its first
argument (tpu-inference's `runner.state_leaves`, flattened from the same
NNX variables the Keras backbone holds). An update writes each new value
into its variable with the variable's current sharding, so every array
keeps its shape, dtype and placement and the compiled programs are reused,
then re-derives the runner's leaves (`refresh_state_leaves`), which would
otherwise keep pointing at the previous arrays. tpu-inference's weight
update session frees the KV cache meanwhile (`start_weight_update`: it was
computed with the old weights, and the freed memory holds the incoming
arrays) and reallocates it (`finish_weight_update`).

Everything the update reads is checked before the first variable is
written: a refused update leaves the engine serving the old weights.
"""

import contextlib
import logging
import time

from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ServingError
from keras_vllm.serve.worker import draft_target

logger = logging.getLogger("keras_vllm")


def _host_memory():
    """Builds an incoming backbone in host memory when the host has a CPU
    backend (accelerator hosts do), not on the first accelerator, which
    holds its share of the served weights already."""
    import jax

    try:
        cpu = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return contextlib.nullcontext()
    return jax.default_device(cpu)


def open_update(path, public_key=None, manifest_hash=None):
    """Opens and verifies the artifact an update reads.

    Args:
        path: the artifact directory.
        public_key: the signature policy the engine was started with.
        manifest_hash: the SHA-256 of `manifest.json` the caller checked;
            an artifact rewritten since is refused.

    Returns:
        The opened, verified `keras_vllm.format.Artifact`.
    """
    from keras_vllm.load.opening import open_verified

    with progress.verbosity(False):
        opened = open_verified(path, public_key=public_key)
    if manifest_hash is not None and (
        fmt.manifest_hash(path) != manifest_hash
    ):
        raise ServingError(
            f"The export '{path}' changed while the engine checked it "
            f"('{fmt.MANIFEST_FILE}' has another digest); nothing was "
            "replaced. Update from a finished export."
        )
    return opened


def artifact_values(artifact, served, dtype, preset=None):
    """The whole weight set of an artifact (preset plus delta).

    A full export stores every variable: its arrays are restored and
    matched to the served backbone directly. A delta (or preset) export's
    backbone is rebuilt from its preset, in host memory, and its
    variables are paired with the served ones by position.

    Args:
        artifact: the opened, verified `keras_vllm.format.Artifact`
            (`open_update`).
        served: the served backbone.
        dtype: the dtype the engine serves in (values are cast as at start).
        preset: the preset override, as `KerasVllmEngine.from_export` took.

    Returns:
        `[(variable, value)]` in `keras_vllm.hub.weights.ordered_variables`
        order.
    """
    from keras_vllm.load import keras_loader
    from keras_vllm.load import rebuild

    manifest = artifact.manifest
    with progress.verbosity(False):
        if fmt.unserved_inputs(manifest):
            # The served backbone is the artifact's text decoder: the whole
            # model is rebuilt and its decoder's variables taken.
            from keras_vllm.load.text_decoder import served_backbone

            with _host_memory():
                backbone = served_backbone(
                    keras_loader.build_backbone(
                        artifact, dtype=dtype, preset=preset
                    ),
                    manifest,
                )
            return weight_io.backbone_values(backbone)
        if manifest["weights"]["mode"] == "full":
            # Every position claimed, each checked against its variable.
            restored = {
                id(variable): value
                for variable, value in rebuild.stored_values(
                    served, artifact, dtype
                )
            }
            return [
                (variable, restored[id(variable)])
                for variable in weight_io.ordered_variables(served)
            ]
        with _host_memory():
            backbone = keras_loader.build_backbone(
                artifact, dtype=dtype, preset=preset
            )
    return weight_io.backbone_values(backbone)


def check_same_variables(running, incoming, source):
    """Refuses an incoming weight set that is not the served one's shape.

    Args:
        running: `[(variable, value)]` of the served backbone.
        incoming: `[(variable, value)]` of the new weights, same order.
        source: what the new weights come from, for the message.

    Raises:
        ServingError: naming the first variable whose path, shape or dtype
            differs.
    """
    def refuse(what):
        raise ServingError(
            f"{source} cannot replace the running engine's weights: {what}. "
            "An update keeps the served model's architecture; start a new "
            "engine for another model (`KerasVllmEngine.from_export`)."
        )

    if len(running) != len(incoming):
        refuse(
            f"it has {len(incoming)} variables, the served backbone "
            f"{len(running)}"
        )
    for (target, _), (variable, value) in zip(running, incoming):
        if weight_io.canonical_path(target.path) != weight_io.canonical_path(
            variable.path
        ):
            refuse(f"it has '{variable.path}' where the served backbone has "
                   f"'{target.path}'")
        if tuple(value.shape) != tuple(target.shape):
            refuse(f"variable '{target.path}' has shape {tuple(value.shape)},"
                   f" the served one {tuple(target.shape)}")
        if str(value.dtype) != str(target.dtype):
            refuse(f"variable '{target.path}' is {value.dtype}, the served "
                   f"one {target.dtype} (pass a model in the served dtype)")


def replace_weights(worker, incoming, source):
    """Writes `incoming` into the served backbone of a tpu-inference worker.

    Args:
        worker: vLLM's worker (tpu-inference's `TPUWorker`).
        incoming: `[(variable, value)]` in the served backbone's order.
        source: what the new weights come from, for messages.

    Returns:
        `{"variables": count, "bytes": bytes written, "seconds": seconds}`.
    """
    from tpu_inference.layers.common.utils import general_device_put

    start = time.perf_counter()
    runner = worker.model_runner
    running = weight_io.backbone_values(runner.model.backbone)
    check_same_variables(running, incoming, source)
    written = 0
    worker.start_weight_update(free_kv_cache=True)
    try:
        for (target, _), (_, value) in zip(running, incoming):
            # The served array's own sharding: the same placement (and
            # so the same compiled programs) as at load.
            target.assign(general_device_put(value, target.value.sharding))
            written += int(value.nbytes)
        runner.refresh_state_leaves()
        # An MTP drafter embeds with the served (now new) embedding.
        draft_target.share_target_weights(getattr(runner, "drafter", None))
    finally:
        worker.finish_weight_update()
    seconds = time.perf_counter() - start
    logger.info(
        "keras-vllm: replaced %d variables (%d bytes) from %s in %.2f s",
        len(running), written, source, seconds,
    )
    return {"variables": len(running), "bytes": written, "seconds": seconds}
