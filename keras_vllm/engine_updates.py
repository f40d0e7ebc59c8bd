"""New weights for a running `KerasVllmEngine`, without a restart.

`KerasVllmEngine.update_weights` calls these. An update changes the
weights only: the engine keeps what it read once at start (vLLM's config
and default sampling, the tokenizer in vLLM's front end, the chat
template, the compiled programs), so an export that differs in any of
these, or in the backbone's architecture, dtype or variable shapes, is
refused before a single weight is written, and the engine goes on serving
the weights it had.
"""

import os
import tempfile
import time

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError

# What the served architecture is made of, besides the config's layer names
# and dtype policy (the dtype is compared on its own).
_UNCOMPARED_CONFIG_KEYS = ("name", "dtype")


def _kept_files(manifest):
    """`{file: sha256}` of what a running engine read once at start and
    keeps, but the tokenizer's config (compared without its layer name)."""
    return {
        rel: entry["sha256"]
        for rel, entry in manifest["files"].items()
        if rel not in (fmt.GOLDEN_FILE, fmt.TOKENIZER_CONFIG_FILE)
        and not rel.startswith(fmt.WEIGHTS_DIR + "/")
    }


def _asset_digests(manifest):
    prefix = fmt.TOKENIZER_ASSETS_DIR + "/"
    return {
        rel[len(prefix):]: entry["sha256"]
        for rel, entry in manifest["files"].items()
        if rel.startswith(prefix)
    }


def _config_difference(running, incoming):
    """The first backbone config key whose value differs, or None."""
    keys = sorted(
        (set(running) | set(incoming)) - set(_UNCOMPARED_CONFIG_KEYS)
    )
    for key in keys:
        if running.get(key) != incoming.get(key):
            return key, running.get(key), incoming.get(key)
    return None


def _tokenizer_config(config):
    """A tokenizer config as compared: keras-hub builds some token lists
    from a Python set (`Llama3Tokenizer`'s `unsplittable_tokens`), so the
    same tokenizer lists them in another order in every process."""
    tokens = config.get("unsplittable_tokens")
    if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
        config = {**config, "unsplittable_tokens": sorted(tokens)}
    return config


def _quantized_layers(fields):
    return (fields.get("quantization") or {}).get("layers") or {}


def _architecture_difference(running, incoming):
    """What differs between two models' `backbone`, `tokenizer` and
    `dtype` manifest fields (or the same fields of a live model), or None."""
    ours, theirs = running["backbone"], incoming["backbone"]
    if ours["registered_name"] != theirs["registered_name"]:
        return (
            f"its backbone is {theirs['registered_name']}, the served one "
            f"{ours['registered_name']}"
        )
    found = _config_difference(ours["config"], theirs["config"])
    if found is not None:
        key, old, new = found
        return (
            f"its backbone config has {key}={new!r}, the served one "
            f"{key}={old!r}"
        )
    if running["dtype"] != incoming["dtype"]:
        return (
            f"its dtype is {incoming['dtype']}, the served one "
            f"{running['dtype']}"
        )
    ours, theirs = _quantized_layers(running), _quantized_layers(incoming)
    if ours != theirs:
        def name(layers):
            modes = sorted(set(layers.values()))
            if not modes:
                return "not quantized"
            return f"quantized ({', '.join(modes)})"

        return (
            f"its weights are {name(theirs)}, the served ones {name(ours)}"
        )
    # The tokenizer's identity, as its fingerprint but without the layer's
    # name (Keras numbers it per process; it tokenizes nothing).
    ours, theirs = running["tokenizer"], incoming["tokenizer"]
    if (
        ours["registered_name"] != theirs["registered_name"]
        or _config_difference(
            _tokenizer_config(ours["config"]),
            _tokenizer_config(theirs["config"]),
        ) is not None
        or _asset_digests(running) != _asset_digests(incoming)
    ):
        return (
            "its tokenizer differs (class, config or assets): vLLM's front "
            "end keeps the tokenizer it started with"
        )
    return None


def check_compatible(running, incoming, source):
    """Refuses an export whose weights cannot replace the served ones.

    Args:
        running: the served artifact's manifest.
        incoming: the new artifact's (verified) manifest.
        source: how to name the new artifact in the message.

    Raises:
        ServingError: naming what differs and how to serve it instead.
    """
    difference = _architecture_difference(running, incoming)
    if difference is None and not incoming.get("servable", True):
        difference = "it was exported unservable (`allow_unservable=True`)"
    if difference is None:
        ours, theirs = _kept_files(running), _kept_files(incoming)
        for rel in sorted(set(ours) | set(theirs)):
            if ours.get(rel) != theirs.get(rel):
                state = "differs" if rel in ours and rel in theirs else (
                    "is missing" if rel in ours else "is extra"
                )
                difference = (
                    f"its '{rel}' {state} (the engine read the served "
                    "artifact's copy at start and keeps it)"
                )
                break
    if difference is None and running["stop_token_ids"] != incoming[
        "stop_token_ids"
    ]:
        difference = (
            f"its stop_token_ids are {incoming['stop_token_ids']}, the served"
            f" ones {running['stop_token_ids']}"
        )
    if difference is not None:
        raise ServingError(
            f"{source} cannot replace the running engine's weights: "
            f"{difference}. An update changes weights only; serve another "
            "model with a new engine (`KerasVllmEngine.from_export(path)`)."
        )


def check_export(running, path, preset, public_key):
    """Every check a fresh start runs on `path`, plus compatibility with
    the served artifact's manifest `running`.

    Returns:
        `(manifest, manifest_hash)` of the verified artifact.
    """
    from keras_vllm.load import keras_loader
    from keras_vllm.load.opening import open_verified

    opened = open_verified(path, validate=False, public_key=public_key)
    opened.validate()
    manifest = opened.manifest
    check_compatible(running, manifest, f"The export '{path}'")
    # Classes, preset availability and the tokenizer's recorded probes, as
    # `from_export` checks them.
    keras_loader.preflight(path, manifest, preset)
    return manifest, fmt.manifest_hash(path)


def _is_in_process(llm):
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
    difference = _architecture_difference(engine.manifest, live)
    if difference is not None:
        raise ServingError(
            f"This {type(causal_lm).__name__} cannot replace the running "
            f"engine's weights: {difference}. An update changes weights "
            "only; export it and start a new engine for it."
        )


def live_model_values(engine, causal_lm):
    """The checked weights of a live `CausalLM`, for an in-process engine.

    Returns:
        `[(variable, value)]` (see `keras_vllm.weights.backbone_values`).

    Raises:
        ServingError: when the model is not the served architecture.
    """
    from keras_vllm import weights as weight_io

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
            manifest, digest = check_export(
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
            engine.path, engine.manifest = path, manifest
            engine.artifact_hash = digest
        elif _is_in_process(llm):
            values = live_model_values(engine, source)
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
