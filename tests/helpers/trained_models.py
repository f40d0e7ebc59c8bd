"""Tiny fine-tuned models, one fine-tune per family configuration per session.

Every test module asks for its model here, so the serving, export, CLI and
fixture tests of a family share one fine-tune: a model is keyed on its full
backbone configuration (the family's variant below plus any overrides), so
two spellings of the same configuration are also one model.

Under pytest-xdist the workers share the fine-tunes too: the first worker to
need a configuration trains it and saves its weights and losses in
`SHARED_DIR` (set by conftest.py to a directory every worker of the session
sees); the others wait on its lock and load them. `fine_tune` is
deterministic, so this only saves time (each fine-tune costs 10-40 s here).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time
import types

from helpers import costs
from keras_vllm import testing

# The tiny configuration each family is tested in: the default tiny model
# unless a variant exercises more of the family's mechanics.
VARIANTS = {family: {} for family in testing.FAMILIES} | {
    # Six layers reach Gemma 3's first global (1M-wavelength RoPE) layer.
    "gemma3": {"num_layers": 6},
    # Six layers reach Gemma 4's first global layer (wider heads, K=V,
    # partial RoPE).
    "gemma4": {"num_layers": 6},
    # "su" (LongRoPE) rotary. With a pretraining length of 48, the short
    # serving prompts and their 32 new tokens stay within it (short factors)
    # and the 63- and 67-token prompts exceed it from the start (long
    # factors); a sequence that crosses it while decoding has no single
    # Keras reference (generate() picks the prefill's factors by its padded
    # max_length).
    "phi3": testing.PHI3_SU_ROPE_SCALING | {"pretraining_sequence_length": 48},
}

_RUNS = {}
# Where the session's workers share fine-tunes (None: this process only).
SHARED_DIR = None
# The platform ("cpu") a stored fine-tune is built and loaded on before its variables
# move to JAX's default device (None: built there). The TPU tier sets the
# host's CPU: building calls the model once eagerly, op by op, and on a
# chip each new op compiles on its own (Qwen 3.5's chunked delta rule took
# ~50 s of a case that way).
BUILD_DEVICE = None


def _frozen(value):
    """A hashable copy of a config value (factor lists become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _overrides(family, overrides):
    config = dict(VARIANTS[family], **overrides)
    # Tuples, not lists: equal configurations give equal cache keys.
    return {key: _frozen(value) for key, value in config.items()}


def training_run(family, **overrides):
    """The fine-tune of `family`'s tiny model, run once per session.

    Args:
        family: string. One of `keras_vllm.testing.FAMILIES`.
        **overrides: backbone arguments on top of the family's `VARIANTS`
            entry.

    Returns:
        A namespace with `causal_lm`, `losses` (one per step),
        `build_seconds` and `fine_tune_seconds` (of the first call).
    """
    overrides = _overrides(family, overrides)
    key = (family, _frozen(testing.backbone_config(family, **overrides)))
    if key not in _RUNS:
        with _shared(key) as stored:
            _RUNS[key] = _run(family, overrides, stored)
    return _RUNS[key]


def _run(family, overrides, stored):
    start = time.perf_counter()
    if stored is not None and os.path.exists(stored + ".json"):
        causal_lm = _built_and_loaded(family, overrides, stored)
        built = time.perf_counter()
        with open(stored + ".json") as f:
            losses = json.load(f)
    else:
        causal_lm = testing.build_tiny_causal_lm(family, **overrides)
        built = time.perf_counter()
        with costs.timed("fine-tune"):
            losses = testing.fine_tune(causal_lm)
        if stored is not None:
            causal_lm.save_weights(stored + ".weights.h5")
            with open(stored + ".json", "w") as f:
                json.dump(losses, f)  # written last: marks the pair done
    return types.SimpleNamespace(
        causal_lm=causal_lm,
        losses=losses,
        build_seconds=built - start,
        fine_tune_seconds=time.perf_counter() - built,
    )


def _built_and_loaded(family, overrides, stored):
    """`stored`'s fine-tune, built and loaded on `BUILD_DEVICE` when set,
    its variables then moved to JAX's default device."""
    import jax

    if BUILD_DEVICE is None:
        place = contextlib.nullcontext()
    else:
        place = jax.default_device(jax.devices(BUILD_DEVICE)[0])
    with place, without_random_init():
        causal_lm = testing.build_tiny_causal_lm(family, **overrides)
    with place:
        causal_lm.load_weights(stored + ".weights.h5")
    if BUILD_DEVICE is not None:
        target = jax.config.jax_default_device or jax.devices()[0]
        for variable in causal_lm.variables:
            variable.assign(jax.device_put(variable.value, target))
    return causal_lm


@contextlib.contextmanager
def without_random_init():
    """Keras' random initializers give zeros inside the block, for models
    whose every value is set right after (loaded weights, a copy's).

    Each initializer draws eagerly, one compiled op per shape: in one
    process on a 2-core CPU host, a tiny Llama built in 1.5 s with zero
    draws, then in 5.6 s with random ones (Gemma 3n: 3.2 and 6.7 s); on the
    TPU host the tier's "model" step took 5-28 s a case (docs/TPU.md).
    A variable left unset would stay zero, so
    use it only where every value is set next: from the stored fine-tune of
    the same configuration (the store's key), or a copy's `set_weights`.
    """
    from unittest import mock

    import keras
    import numpy as np
    from keras import backend
    from keras.src import backend as backend_modules
    from keras.src import random as keras_random

    def zeros(shape, *args, dtype=None, **kwargs):
        dtype = backend.standardize_dtype(dtype or backend.floatx())
        return np.zeros(tuple(shape), dtype)

    draws = dict(normal=zeros, uniform=zeros, truncated_normal=zeros)
    with contextlib.ExitStack() as stack:
        # Keras' initializers draw through the backend's module; other
        # code through the public namespaces.
        for module in (backend_modules.random, keras_random, keras.random):
            stack.enter_context(mock.patch.multiple(module, **draws))
        yield


@contextlib.contextmanager
def _shared(key):
    """Holds the session-wide lock of `key`'s fine-tune; yields the path
    prefix of its stored weights (None when workers share nothing)."""
    if SHARED_DIR is None:
        yield None
        return
    os.makedirs(SHARED_DIR, exist_ok=True)
    name = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    stored = os.path.join(SHARED_DIR, f"{key[0]}-{name}")
    with open(stored + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield stored
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def trained_copy(family):
    """A new model with `trained(family)`'s weights, for tests that change
    a model (quantize it, fine-tune it further)."""
    with without_random_init():
        copy = testing.build_tiny_causal_lm(family, **VARIANTS[family])
    copy.set_weights(trained(family).get_weights())
    return copy


def trained(family, **overrides):
    """A tiny fine-tuned CausalLM of `family`, shared by the whole session.

    Tests must not change the returned model (other modules reuse it);
    export it, call it, or copy its preset instead.

    Example:

    ```python
    causal_lm = trained("gpt2")
    path = causal_lm.export_vllm(tmp_path / "artifact")
    ```
    """
    return training_run(family, **overrides).causal_lm


_LORA_FINE_TUNES = {}


def lora_fine_tune(family, texts, rank=2, steps=8, learning_rate=5e-2):
    """`trained(family)` fine-tuned further with LoRA (`enable_lora(rank)`)
    on `texts`, once per process and arguments: the adapter tests of
    several modules share it. Tests must not change the returned model."""
    key = (family, tuple(texts), rank, steps, learning_rate)
    if key not in _LORA_FINE_TUNES:
        model = trained_copy(family)
        model.backbone.enable_lora(rank)
        with costs.timed("fine-tune"):
            testing.fine_tune(
                model, steps=steps, texts=texts, learning_rate=learning_rate
            )
        _LORA_FINE_TUNES[key] = model
    return _LORA_FINE_TUNES[key]
