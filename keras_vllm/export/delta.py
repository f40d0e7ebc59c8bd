"""Weights stored as a delta: what fine-tuning changed against the preset."""

import numpy as np

from keras_vllm.hub import weights as weight_io
from keras_vllm.errors import ExportError
from keras_vllm.export import quantized


def against_preset(backbone, weights, handle, dtype, quantized_layers):
    """Returns the subset of `weights` that differ from the preset's.

    The preset is loaded through keras-hub (a Keras preset or a converted
    Hugging Face checkpoint alike); its config must equal the model's.

    Args:
        backbone: the fine-tuned backbone.
        weights: its `{path: array}` weights, in the backbone's order.
        handle: the preset handle.
        dtype: the backbone's variable dtype name (the preset is loaded in it).
        quantized_layers: the backbone's quantized layers, by their live
            paths (empty if none).

    Raises:
        ExportError: the model is not built from that preset.
    """
    import keras_hub

    base = keras_hub.models.Backbone.from_preset(handle, dtype=dtype)
    config = backbone.get_config()
    if quantized_layers:
        # The quantized layers' policies are the difference the delta
        # stores; the rest of the config must be the preset's.
        config = {**config, "dtype": base.get_config()["dtype"]}
    # A converted Hugging Face checkpoint gets an auto-numbered layer name
    # per load, so names are not compared (as the loader does not).
    unnamed = lambda c: {k: v for k, v in c.items() if k != "name"}
    if type(base) is not type(backbone) or unnamed(
        base.get_config()
    ) != unnamed(config):
        raise ExportError(
            f"The model's backbone config differs from the preset "
            f"'{handle}', so its weights cannot be stored as a delta. Export "
            "with `weights='full'`, or pass the preset it was built from."
        )
    base_weights = list(weight_io.backbone_weights(base).items())
    if quantized_layers:
        return quantized.delta(weights, quantized_layers, dict(base_weights))
    if len(base_weights) != len(weights) or any(
        weight_io.canonical_path(a) != weight_io.canonical_path(b)
        for a, (b, _) in zip(weights, base_weights)
    ):
        raise ExportError(
            f"The model's variables do not match the preset '{handle}'. "
            "Export with `weights='full'`."
        )
    # Compared by position: auto-named layers get other paths in a second
    # model built in the same process.
    return {
        path: value
        for (path, value), (_, base_value) in zip(weights.items(), base_weights)
        if not np.array_equal(value, base_value)
    }
