"""Is an export a weights-only update of the served artifact?

`KerasVllmEngine.update_weights` and the reload route
(`serve/frontend/reload.py`) call these. An update changes the
weights only: the engine keeps what it read once at start (vLLM's config
and default sampling, the tokenizer in vLLM's front end, the chat
template, the compiled programs), so an export that differs in any of
these, or in the backbone's architecture, dtype or variable shapes, is
refused before a single weight is written, and the engine goes on serving
the weights it had.
"""

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError
from keras_vllm.load import quantized

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
    layers = (fields.get("quantization") or {}).get("layers") or {}
    return quantized.comparable_layers(layers)


def architecture_difference(running, incoming):
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
    difference = architecture_difference(running, incoming)
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
        `(artifact, manifest_hash)`: the opened, verified
        `keras_vllm.format.Artifact` and its manifest's digest.
    """
    from keras_vllm.load import keras_loader
    from keras_vllm.load.opening import open_verified

    opened = open_verified(path, validate=False, public_key=public_key)
    opened.validate()
    check_compatible(running, opened.manifest, f"The export '{path}'")
    # Classes, preset availability and the tokenizer's recorded probes, as
    # `from_export` checks them.
    keras_loader.preflight(opened, preset)
    return opened, fmt.manifest_hash(path)
