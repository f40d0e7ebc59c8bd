"""New weights for a running `KerasVllmEngine`, without a restart.

`KerasVllmEngine.update_weights` calls these. What may change is checked by
`keras_vllm.load.update_checks` (the reload route runs the same checks);
the worker side is `keras_vllm.serve.worker.weight_update`.
"""

import os
import tempfile
import time

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError
from keras_vllm.load import update_checks


def in_process(llm):
    """Whether `llm`'s engine runs in this process."""
    from vllm.v1.engine.core_client import InprocClient

    return isinstance(getattr(llm.llm_engine, "engine_core", None), InprocClient)


def check_live_model(engine, causal_lm):
    """Refuses a live model that is not the served architecture.

    Raises:
        ServingError: naming what differs, or that it is no `CausalLM`.
    """
    from keras_vllm.export import quantized
    from keras_vllm.export import sections

    backbone = getattr(causal_lm, "backbone", None)
    tokenizer = getattr(getattr(causal_lm, "preprocessor", None), "tokenizer", None)
    if backbone is None or tokenizer is None:
        raise ServingError(
            f"update_weights takes an export path or a KerasHub CausalLM "
            f"with a preprocessor, not {type(causal_lm).__name__}."
        )
    with tempfile.TemporaryDirectory() as directory:
        # The tokenizer as an export writes it: its config and assets.
        dtype = backbone.dtype_policy.variable_dtype
        live = {
            "backbone": sections.serialize(backbone, "backbone"),
            "tokenizer": sections.tokenizer_section(tokenizer, directory),
            "dtype": dtype,
            "quantization": quantized.section(backbone, dtype),
            "files": fmt.file_table(directory),
        }
    difference = update_checks.architecture_difference(engine.manifest, live)
    if difference is not None:
        raise ServingError(
            f"This {type(causal_lm).__name__} cannot replace the running "
            f"engine's weights: {difference}. An update changes weights "
            "only; export it and start a new engine for it."
        )


def live_model_values(engine, causal_lm):
    """The checked weights of a live `CausalLM`, for an in-process engine.

    Returns:
        `[(variable, value)]` (see `keras_vllm.hub.weights.backbone_values`).

    Raises:
        ServingError: when the model is not the served architecture.
    """
    from keras_vllm.hub import weights as weight_io

    check_live_model(engine, causal_lm)
    return weight_io.backbone_values(causal_lm.backbone)


def _update_from_live_export(engine, causal_lm):
    """A live model's weights for an engine in its own process (vLLM's
    default): the engine process cannot reach this process's arrays, so
    the model is exported (all its weights, no golden outputs) to a
    temporary artifact that the worker reads, verified as any update."""
    from keras_vllm.export import export_vllm

    check_live_model(engine, causal_lm)
    if engine._public_key is not None:
        raise ServingError(
            "This engine serves signed artifacts only (it was started with "
            "a public key), and a live model has no signature. Export it, "
            "sign it (`signing_key=` or `keras-vllm sign`) and pass the "
            "path: `engine.update_weights(path)`."
        )
    with tempfile.TemporaryDirectory(prefix="keras_vllm_update_") as root:
        path = export_vllm(
            causal_lm,
            os.path.join(root, "live"),
            weights="full",
            golden_prompts=(),
            max_sequence_length=engine.manifest["max_sequence_length"],
            chat_template=False,
            verbose=False,
        )
        engine.llm.reset_prefix_cache()
        return engine.llm.collective_rpc(
            "keras_vllm_update_from_artifact",
            args=(path, None, None, fmt.manifest_hash(path)),
        )[0]


def update_weights(engine, source):
    """`KerasVllmEngine.update_weights`: checks, then one worker call."""
    start = time.perf_counter()
    with engine._lock:
        engine._check_running()
        if getattr(engine, "adapters", None) is not None:
            # Its adapters were checked against, and fine-tuned from, the
            # served base.
            raise ServingError(
                "This engine serves LoRA adapters of its base, so its base "
                "weights are not replaced. Start a new engine on the new base "
                "with adapters exported against it."
            )
        llm = engine.llm
        if isinstance(source, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(source))
            artifact, digest = update_checks.check_export(
                engine.manifest, path, engine._preset, engine._public_key
            )
            # Blocks cached with the old weights must not answer new
            # requests (tpu-inference frees the KV cache, not the
            # scheduler's prefix index).
            llm.reset_prefix_cache()
            result = llm.collective_rpc(
                "keras_vllm_update_from_artifact",
                args=(path, engine._preset, engine._public_key, digest),
            )[0]
            engine.artifact = artifact
            engine.artifact_hash = digest
            engine._caller_arrays = False
        else:
            if in_process(llm):
                values = live_model_values(engine, source)
                # The served variables may now hold the caller's arrays.
                engine._caller_arrays = True
                llm.reset_prefix_cache()
                result = llm.collective_rpc(
                    "keras_vllm_update_from_values", args=(values,)
                )[0]
            else:
                result = _update_from_live_export(engine, source)
            engine.artifact_hash = None
            engine._live_updates += 1
        label_weights(engine)
    return dict(result, seconds=time.perf_counter() - start)


def label_weights(engine):
    """Names the served weights in vLLM's weight version, which every
    `CompletionOutput.weight_versions` span reports: the artifact hash, or
    `live-N` after the N-th update from a live model."""
    version = engine.artifact_hash or f"live-{engine._live_updates}"
    llm_engine = getattr(engine.llm, "llm_engine", None)
    if hasattr(llm_engine, "set_weight_version"):
        llm_engine.set_weight_version(version)
