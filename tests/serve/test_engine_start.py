"""What an engine start spends, decided without starting one.

- On a CPU host the KV cache is planned for the engine's `max_num_seqs`
  sequences of `max_model_len` tokens, within the memory budget
  (`keras_vllm.cpu.kv_capacity`; the engine-level check is in
  test_cpu_vllm_smoke.py).
- A warm start skips the precompilation only when its marker names the
  same programs (`keras_vllm.serve.worker.warm_start`; the engine-level check is in
  test_compile_cache.py).
"""

import types

import pytest

from keras_vllm.cpu import kv_capacity

pytest.importorskip("vllm")


def _spec(block_size, page_size_bytes):
    return types.SimpleNamespace(
        block_size=block_size, page_size_bytes=page_size_bytes
    )


class _VllmConfig(types.SimpleNamespace):
    def compute_hash(self):
        # As vLLM's: the model's path is one of the factors.
        return f"{self.settings}@{self.model_config.model}"


def _vllm_config(
    max_num_seqs=4, max_model_len=256, settings="h", model="/exports/a"
):
    return _VllmConfig(
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
        model_config=types.SimpleNamespace(
            max_model_len=max_model_len, model=model
        ),
        settings=settings,
    )


def test_blocks_needed_covers_every_sequence_at_full_length():
    # 256 tokens in 128-token blocks, plus one of slack, per sequence.
    assert kv_capacity.blocks_needed(4, 256, 128) == 12
    assert kv_capacity.blocks_needed(4, 257, 128) == 16
    assert kv_capacity.blocks_needed(1, 1, 16) == 2


def test_available_memory_is_capped_at_what_the_engine_can_use():
    specs = {"layer.0": _spec(128, 1000), "layer.1": _spec(128, 1000)}
    needed = 2 * kv_capacity.blocks_needed(4, 256, 128) * 1000
    config = _vllm_config()
    assert kv_capacity.capped([10**9], [specs], config) == [needed]
    # A budget smaller than the need is kept: vLLM then plans fewer blocks
    # (or refuses a `max_model_len` that does not fit), as before.
    assert kv_capacity.capped([needed - 1], [specs], config) == [needed - 1]
    # Each worker is capped by its own layers.
    assert kv_capacity.capped([10**9, 10**9], [specs, {}], config) == [
        needed, 10**9
    ]


def _kv_cache_config(num_blocks, groups=("group",)):
    return types.SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=groups)


def _device(kind="cpu"):
    return types.SimpleNamespace(platform="cpu", device_kind=kind)


def test_program_key_names_the_architecture_not_the_weights():
    from keras_vllm.serve.worker import warm_start

    llama = {
        "backbone": {"class_name": "LlamaBackbone", "config": {"hidden": 32}},
        "dtype": "float32",
        "quantization": None,
    }

    def key(model=llama, config=None, blocks=48, devices=(_device(),)):
        return warm_start.program_key(warm_start.program_factors(
            model, config or _vllm_config(), _kv_cache_config(blocks), devices
        ))

    # The manifest fields a key reads hold no weights or their hashes, and
    # the artifact's path is not a factor: an export of new weights of the
    # same model, anywhere, finds the same marker.
    assert key() == key(dict(llama))
    assert key() == key(config=_vllm_config(model="/exports/step_200"))
    changes = [
        key(dict(llama, backbone={"class_name": "LlamaBackbone",
                                  "config": {"hidden": 64}})),
        key(dict(llama, dtype="bfloat16")),
        key(dict(llama, quantization={"mode": "int8"})),
        key(config=_vllm_config(settings="other engine settings")),
        key(blocks=96),
        key(devices=(_device(), _device())),
        key(devices=(_device("TPU v5 lite"),)),
    ]
    assert len({key(), *changes}) == len(changes) + 1


def test_markers_are_kept_only_in_a_local_cache(monkeypatch, tmp_path):
    import jax

    from keras_vllm.serve.worker import warm_start

    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert warm_start._marker_path("abc") == str(
            tmp_path / warm_start.MARKER_DIR / "abc"
        )
        jax.config.update("jax_compilation_cache_dir", "gs://bucket/cache")
        assert warm_start._marker_path("abc") is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_lazy_warm_starts_only_where_every_program_is_cached(monkeypatch):
    import jax

    from keras_vllm.serve.worker import warm_start

    worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(
            model_config=types.SimpleNamespace(enforce_eager=False)
        )
    )
    threshold = "jax_persistent_cache_min_compile_time_secs"
    before = getattr(jax.config, threshold)
    for name in ("SKIP_JAX_PRECOMPILE", "KERAS_VLLM_LAZY_WARM_START"):
        monkeypatch.delenv(name, raising=False)
    try:
        jax.config.update(threshold, 0.0)
        assert warm_start._lazy_allowed(worker)
        # Programs that compile in under a second would not be cached.
        jax.config.update(threshold, 1.0)
        assert not warm_start._lazy_allowed(worker)
        jax.config.update(threshold, 0.0)
        for name, value in (
            ("KERAS_VLLM_LAZY_WARM_START", "0"),
            # Nothing is precompiled to skip.
            ("SKIP_JAX_PRECOMPILE", "1"),
        ):
            with monkeypatch.context() as patch:
                patch.setenv(name, value)
                assert not warm_start._lazy_allowed(worker), name
        # The user asked vLLM to fail on any compile after warm-up (set on
        # the module: vLLM caches its variables once an engine started).
        import vllm.envs

        with monkeypatch.context() as patch:
            patch.setattr(
                vllm.envs, "VLLM_XLA_CHECK_RECOMPILATION", True, raising=False
            )
            assert not warm_start._lazy_allowed(worker)
    finally:
        jax.config.update(threshold, before)


def test_keras_layer_names_do_not_change_the_programs():
    pytest.importorskip("tpu_inference")
    from keras_vllm.serve.worker import warm_start

    entries = []
    for name in ("llama_backbone", "llama_backbone_3"):
        config = _vllm_config()
        manifest = {
            "backbone": {
                "class_name": "LlamaBackbone",
                "config": {"name": name, "hidden_dim": 32},
            },
            "dtype": "float32",
        }
        warm_start.register_model(config, manifest)
        entries.append(warm_start._models.pop(id(config)))
    assert entries[0] == entries[1]
    assert entries[0]["backbone"]["config"] == {"hidden_dim": 32}
