"""Warm restarts: an engine whose programs are cached loads them on use.

Before it serves, tpu-inference precompiles one program per token bucket,
request bucket, sampling and logprob variant (about 140 for a small model
on CPU). With the persistent compile cache (`serve/worker/compile_cache.py`) a restart
compiles none of them, but it still traces, lowers and runs every one:
~6.5 s of a ~20 s warm start of the tiny benchmark model on 2 CPU cores,
and minutes for a large model on a TPU, for buckets the first requests may
never use.

So a keras-vllm engine that completed its precompilation leaves a marker in
the compile cache directory, named by everything that decides which programs
it compiles: the model's architecture (the manifest's backbone class and
config, dtype and quantization, not its weights or its path; and
`KERAS_VLLM_MOE_EXPERTS`), vLLM's config
hash (`VllmConfig.compute_hash()`: cache, parallel, scheduler, LoRA and
compilation settings), the KV cache's blocks and layout, the devices and the
versions of vLLM, tpu-inference, JAX, Keras and keras-vllm. A later start
that finds its marker skips the precompilation; each program is then traced
and loaded from the cache when a step first needs it (tens of milliseconds
on CPU) instead of all of them up front.

The marker is only a hint about speed, never about correctness: JAX keys
each cached program by the program itself, so a start with another model
(or new weights, which are arguments) cannot run a stale one; at worst a
missing cache entry is compiled on first use. The full precompilation still
runs when there is no marker, when the compile cache is off or remote, when
JAX would not cache every program (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`
above 0), on multi-host engines (hosts precompile in lockstep), with
`VLLM_XLA_CHECK_RECOMPILATION`, and with `KERAS_VLLM_LAZY_WARM_START=0`.

Patched: `TPUWorker.initialize_from_config` (tpu-inference 0.32.0, pinned in
`keras_vllm.patching.PINNED_VERSIONS`), the call that precompiles the
sampling programs and allocates the KV cache; `capture_model` follows it.
Only engines serving a keras-vllm artifact are changed.
"""

import copy
import hashlib
import importlib.metadata
import json
import logging
import os

from keras_vllm import envs
from keras_vllm import patching

logger = logging.getLogger("keras_vllm")

MARKER_DIR = "keras_vllm_warm_starts"
# The packages whose code shapes the compiled programs.
_PACKAGES = (
    "jax", "jaxlib", "vllm-tpu", "tpu-inference", "keras", "keras-hub",
    "keras-vllm",
)

# `id(vllm_config)` of each keras-vllm model loaded in this process -> what
# of its manifest decides its programs.
_models = {}


def register_model(vllm_config, manifest):
    """Marks `vllm_config`'s engine as serving the artifact of `manifest`.

    Called when a `KerasVllmForCausalLM` loads, in the engine process.
    """
    backbone = dict(manifest.get("backbone") or {})
    if isinstance(backbone.get("config"), dict):
        # Keras' layer name ("llama_backbone_3") counts layers built in the
        # exporting process; it names no computation.
        backbone["config"] = {
            k: v for k, v in backbone["config"].items() if k != "name"
        }
    _models[id(vllm_config)] = {
        "backbone": backbone,
        "dtype": manifest.get("dtype"),
        "quantization": manifest.get("quantization"),
        # Dense or routed mixture-of-experts blocks: other programs.
        "moe_experts": envs.MOE_EXPERTS.get(),
    }
    _install()


def _versions():
    versions = {}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def settings_hash(vllm_config):
    """vLLM's config hash, blind to where the artifact lies.

    `VllmConfig.compute_hash()` covers the engine settings that shape its
    programs, and the model's path: a new export of the same model in
    another directory would never find its marker. The model's
    architecture is in the registered manifest fields instead.
    """
    config = copy.copy(vllm_config)
    model_config = copy.copy(vllm_config.model_config)
    # Copies, so the engine's own configs are untouched; `object.__setattr__`
    # because vLLM's configs validate assignments.
    object.__setattr__(model_config, "model", "")
    object.__setattr__(config, "model_config", model_config)
    return config.compute_hash()


def program_factors(model, vllm_config, kv_cache_config, devices):
    """What decides an engine's set of programs, as a JSON-able dict.

    Args:
        model: the registered manifest fields (`register_model`).
        vllm_config: the engine's `VllmConfig`.
        kv_cache_config: vLLM's `KVCacheConfig` the worker allocates.
        devices: the JAX devices the engine computes on.
    """
    return {
        "model": model,
        "vllm": settings_hash(vllm_config),
        "kv_blocks": kv_cache_config.num_blocks,
        "kv_groups": [repr(group) for group in kv_cache_config.kv_cache_groups],
        "devices": [(d.platform, d.device_kind) for d in devices],
        "versions": _versions(),
    }


def program_key(factors):
    """The hex digest of `program_factors(...)`: the marker's name."""
    text = json.dumps(factors, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _marker_path(key):
    """The marker file for `key`, or None when markers cannot be kept."""
    import jax

    directory = jax.config.jax_compilation_cache_dir
    if not directory or "://" in str(directory):
        return None  # Off, or a remote cache (gs://...): always precompile.
    return os.path.join(str(directory), MARKER_DIR, key)


def _lazy_allowed(worker):
    import jax
    from tpu_inference import envs as tpu_envs
    from vllm import envs as vllm_envs

    if (tpu_envs.SKIP_JAX_PRECOMPILE
            or worker.model_runner.model_config.enforce_eager):
        return False  # Nothing is precompiled anyway.
    if vllm_envs.VLLM_XLA_CHECK_RECOMPILATION or jax.process_count() > 1:
        return False
    if jax.config.jax_persistent_cache_min_compile_time_secs > 0:
        return False  # Programs that compile fast are not in the cache.
    return envs.LAZY_WARM_START.get()


def _plan(worker, kv_cache_config):
    """`(marker path, factors)` for this worker's engine, or None to leave
    it be."""
    model = _models.get(id(worker.vllm_config))
    if model is None or not _lazy_allowed(worker):
        return None
    devices = worker.model_runner.mesh.devices.flat
    factors = program_factors(
        model, worker.vllm_config, kv_cache_config, devices
    )
    marker = _marker_path(program_key(factors))
    return None if marker is None else (marker, factors)


def _skip_precompilation(manager):
    def skip(original):
        def skipped():
            return None

        return skipped

    # Instance attributes: this engine's manager only.
    for name in ("_precompile_sampling", "_precompile_gather_logprobs",
                 "capture_model"):
        patching.replace(manager, name, skip)


def _mark_after_precompilation(manager, marker, factors):
    def marking(capture):
        def capture_model():
            capture()
            _write_marker(marker, factors)

        return capture_model

    patching.replace(manager, "capture_model", marking)


def _write_marker(marker, factors):
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        staged = f"{marker}.{os.getpid()}.tmp"
        # What the name stands for, for whoever wonders why a start was
        # (not) warm.
        with open(staged, "w") as f:
            json.dump(factors, f, sort_keys=True, indent=1, default=repr)
        os.replace(staged, marker)
    except OSError as e:  # A read-only cache still serves; next start compiles.
        logger.warning(
            "keras-vllm: could not record the warm-start marker %s (%s); the "
            "next start precompiles again.", marker, e,
        )


def _install():
    from tpu_inference.worker.tpu_worker import TPUWorker

    patching.replace(TPUWorker, "initialize_from_config", _planning_start)


def _planning_start(original):

    def initialize_from_config(self, kv_cache_config):
        plan = _plan(self, kv_cache_config)
        marker = plan and plan[0]
        manager = self.model_runner.compilation_manager
        if marker is not None and os.path.isfile(marker):
            logger.info(
                "keras-vllm: warm start (compile cache marker %s): programs "
                "load from the cache when first used.", os.path.basename(marker),
            )
            _skip_precompilation(manager)
        elif marker is not None:
            _mark_after_precompilation(manager, *plan)
        return original(self, kv_cache_config)

    return initialize_from_config
