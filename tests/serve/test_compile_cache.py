"""Warm restarts: a new engine process loads its programs from vLLM's
persistent compile cache (on first use, once a start of the same engine
configuration precompiled them all), and never serves an edited artifact
with another artifact's programs."""

import os

import pytest

from helpers import engine_shapes
from helpers import serving_checks
from helpers import updated_models
from keras_vllm.serve.worker import compile_cache
from keras_vllm import envs
from keras_vllm.hub import reference
from keras_vllm import testing
from keras_vllm.serve.worker import warm_start

_THRESHOLD = "jax_persistent_cache_min_compile_time_secs"


@pytest.fixture
def jax_cache_config():
    """Restores the process' JAX cache settings after a test changes them
    (and reopens its persistent cache there: `fresh_jax_cache`)."""
    import jax
    from jax._src import compilation_cache

    names = (_THRESHOLD, "jax_compilation_cache_dir")
    before = {name: getattr(jax.config, name) for name in names}
    yield jax.config
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def fresh_jax_cache():
    """Makes this process compile its programs again into the cache
    directory an engine will set.

    JAX opens its persistent cache once per process, at the first compile
    after a directory is set, and a later directory does not move it. An
    engine in this process (a TPU host's, where the test process holds the
    chip) would write into the cache the process opened for its Keras
    models, and reuse programs earlier engines compiled, unless both the
    programs in memory and the opened cache are dropped.
    """
    import jax
    from jax._src import compilation_cache

    jax.clear_caches()
    compilation_cache.reset_cache()


def test_every_program_is_cached_unless_told_otherwise(
    jax_cache_config, monkeypatch, tmp_path
):
    pytest.importorskip("vllm")
    for variable in (
        envs.PERSISTENT_CACHE_MIN_COMPILE_TIME,
        envs.COMPILATION_CACHE_DIR,
    ):
        monkeypatch.delenv(variable.name, raising=False)
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("VLLM_XLA_CACHE_PATH", str(tmp_path / "vllm"))
    jax_cache_config.update(_THRESHOLD, 1.0)
    assert compile_cache.cache_every_program() == str(tmp_path / "vllm")
    assert getattr(jax_cache_config, _THRESHOLD) == 0.0

    # The caller's own JAX settings are kept.
    monkeypatch.setenv(envs.PERSISTENT_CACHE_MIN_COMPILE_TIME.name, "2.5")
    monkeypatch.setenv(envs.COMPILATION_CACHE_DIR.name, str(tmp_path / "own"))
    jax_cache_config.update(_THRESHOLD, 2.5)
    jax_cache_config.update("jax_compilation_cache_dir", str(tmp_path / "own"))
    assert compile_cache.cache_every_program() == str(tmp_path / "own")
    assert getattr(jax_cache_config, _THRESHOLD) == 2.5

    # vLLM's switch turns it all off.
    monkeypatch.delenv(envs.PERSISTENT_CACHE_MIN_COMPILE_TIME.name)
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    jax_cache_config.update(_THRESHOLD, 1.0)
    assert compile_cache.cache_every_program() is None
    assert getattr(jax_cache_config, _THRESHOLD) == 1.0


def _entries(directory):
    return set(os.listdir(directory)) if os.path.isdir(directory) else set()


def _served(path, prompts):
    import keras_vllm
    from vllm import SamplingParams

    engine = keras_vllm.KerasVllmEngine.from_export(
        path, **engine_shapes.ENGINE_KWARGS
    )
    try:
        params = SamplingParams(
            temperature=0.0, max_tokens=serving_checks.NEW_TOKENS,
            ignore_eos=True,
        )
        return [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params)]
    finally:
        engine.shutdown()


def test_a_warm_start_reuses_programs_and_serves_the_new_weights(
    tmp_path, monkeypatch, jax_cache_config
):
    """Two engines, one after the other, on one fresh cache (each in a
    process of its own, or both in this one, as on a TPU host whose test
    process holds the chip), with the product's warm-up: the first precompiles and writes every program,
    then its warm-start marker; the second, on an artifact with other
    weights of the same model, finds the marker, skips the precompilation
    (it does not write the marker again), loads programs as its steps need
    them (it writes few new ones) and serves its own model's tokens, not the
    first one's."""
    pytest.importorskip("tpu_inference")
    models, paths = updated_models.exported_pair(tmp_path)
    cache = str(tmp_path / "xla_cache")
    # The product's settings, not the test session's (conftest's
    # `compile_cache` sets JAX's variables for every other engine).
    for variable in (
        envs.PERSISTENT_CACHE_MIN_COMPILE_TIME,
        envs.COMPILATION_CACHE_DIR,
    ):
        monkeypatch.delenv(variable.name, raising=False)
    monkeypatch.setenv("VLLM_XLA_CACHE_PATH", cache)
    # conftest's `compile_on_demand` skips the warm-up for other engines.
    monkeypatch.delenv("SKIP_JAX_PRECOMPILE", raising=False)
    monkeypatch.delenv(envs.LAZY_WARM_START.name, raising=False)
    prompts = testing.prompts()
    markers = os.path.join(cache, warm_start.MARKER_DIR)

    fresh_jax_cache()
    old = _served(paths.old, prompts)
    cold = _entries(cache)
    (marker,) = os.listdir(markers)
    written = os.stat(os.path.join(markers, marker)).st_mtime_ns
    new = _served(paths.new, prompts)
    added = _entries(cache) - cold
    assert os.listdir(markers) == [marker]
    assert os.stat(os.path.join(markers, marker)).st_mtime_ns == written

    def want(model):
        ids = [reference.prompt_token_ids(model, text) for text in prompts]
        return reference.greedy_batch(model, ids, serving_checks.NEW_TOKENS, [])

    assert old == want(models.old)
    assert new == want(models.new)
    assert new != old
    # Fewer than 1 in 10 programs compiled again (vLLM's own small host
    # programs with varying inputs may be); without the lowered threshold
    # nearly none would have been cached at all.
    assert len(cold) > 20, sorted(cold)
    assert len(added) < len(cold) / 10, sorted(added)
