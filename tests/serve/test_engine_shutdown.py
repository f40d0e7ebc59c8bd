"""What `KerasVllmEngine.shutdown()` frees in the caller's process.

Each test starts its own engine while no other engine of this module is
alive: on a TPU the KV cache of a running engine fills ~92% of the chip, so
a second engine beside it cannot start however well the first one's
shutdown works (on the chip, 2026-12-07, these checks failed that way while
they shared a module with a running engine). The tiny llama's artifact,
and the same model fine-tuned further as a live model for an update.
"""

import threading

import pytest

pytest.importorskip("tpu_inference")

from helpers import engine_shapes  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers import updated_models  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """The tiny llama's export, served in this process, after one engine
    on it has started, served and shut down.

    The first engine in a process leaves arrays that every later one
    shares (process-wide caches: measured here as one weight-sized set
    after the first of three engines, none added by the next two; in a
    worker of the clean-clone suite 9.6 of the first engine's 28 MB, not
    reproduced alone), so the checks count only what an engine of their
    own keeps."""
    import keras_vllm

    root = tmp_path_factory.mktemp("shutdown")
    path = updated_models.export(trained("llama"), root / "llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine = keras_vllm.KerasVllmEngine.from_export(
            path, **engine_shapes.ENGINE_KWARGS
        )
        assert engine.generate(testing.prompts()[:1], use_tqdm=False)
        serving_checks.shutdown(engine)
        yield path


def _live_device_bytes():
    import jax

    return sum(array.nbytes for array in jax.live_arrays())


# ~10 s of CI: the module's first engine (above), then its own.
def test_shutdown_returns_the_engines_device_memory(artifact):
    """An engine in this process frees its weights and KV cache at
    `shutdown()`, also while something still references its objects. On a
    TPU, whose KV cache fills most of the chip, the next engine's start in
    the same process failed ("total_hbm_used_gb ... exceeds
    total_hbm_limit_cap_gb"): first because the engine's objects sit in
    reference cycles, then (on the chip, 2026-12-07) because of who else
    held them: the traceback of a failed request, kept here as pytest and
    interactive sessions keep the last one (`sys.last_traceback`);
    keras-vllm's record of a per-engine patch; JAX's caches of
    tpu-inference's jitted runner methods."""
    from vllm.exceptions import VLLMValidationError

    import keras_vllm

    before = _live_device_bytes()
    engine = keras_vllm.KerasVllmEngine.from_export(
        artifact, **engine_shapes.ENGINE_KWARGS
    )
    assert engine.generate(testing.prompts()[:1], use_tqdm=False)
    held = _live_device_bytes() - before
    with pytest.raises(VLLMValidationError, match="out of vocabulary") as failed:
        engine.generate([{"prompt_token_ids": [10**7]}], use_tqdm=False)
    # A call running in another thread (holding the engine's lock, as
    # generate() does) finishes before shutdown() frees its arrays.
    closing = threading.Thread(target=engine.shutdown)
    with engine._lock:
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()
        assert engine.generate(testing.prompts()[:1], use_tqdm=False)
    closing.join()
    kept = _live_device_bytes() - before
    assert failed.tb is not None  # the failed call's frames, still held
    assert held > 1 << 20, held
    assert kept < held / 10, (held, kept)


# ~10 s of CI: 20 more fine-tuning steps (shared with test_weight_updates
# in a process that runs both), an engine started, updated, shut down.
def test_shutdown_after_a_live_update_leaves_the_callers_arrays(artifact):
    """After an in-process update from a live model the served variables
    may hold that model's own arrays: `shutdown()` frees the KV cache but
    not them, and the model still runs."""
    import keras_vllm

    live = updated_models.updated_llama()
    engine = keras_vllm.KerasVllmEngine.from_export(
        artifact, **engine_shapes.ENGINE_KWARGS
    )
    engine.update_weights(live)
    serving_checks.shutdown(engine)
    values = [v.value for v in live.backbone.weights]
    assert not any(getattr(v, "is_deleted", lambda: False)() for v in values)
    # Runs on the model's own arrays.
    prompt = reference.prompt_token_ids(live, testing.prompts()[0])
    assert reference.greedy_continuation(live, prompt, 4, stop_token_ids=())
