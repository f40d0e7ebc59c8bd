"""Shared fixtures: tiny models built offline, trained once per session."""

import functools
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_NNX_ENABLED", "true")

import pytest  # noqa: E402


@functools.lru_cache(maxsize=None)
def trained_model(family, **overrides):
    """A tiny fine-tuned CausalLM of `family`, built once per session."""
    from keras_vllm import testing

    causal_lm = testing.build_tiny_causal_lm(family, **overrides)
    testing.fine_tune(causal_lm)
    return causal_lm


def trained(family, **overrides):
    # Lists (e.g. rope factors) become tuples so the cache can key on them.
    frozen = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in sorted(overrides.items())
    }
    return trained_model(family, **frozen)


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")
