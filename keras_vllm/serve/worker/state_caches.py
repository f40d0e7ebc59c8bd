"""Recurrent-state caches (vLLM `MambaSpec`s) for keras-vllm artifacts.

tpu-inference 0.32.0's `KVCacheManager.get_kv_cache_spec` (the runner's
`runner/kv_cache_manager.py`) has two paths: vLLM's PyTorch models get a
`MambaSpec` for every `MambaBase` module, with attention and state pages
padded to one size (`update_mamba_page_size_padded`); JAX models, the path
keras-vllm serves through, get one attention spec per layer and never a
state spec. A layer with a recurrent state (Gated DeltaNet) would then be
handed a KV cache instead of its `(conv_state, recurrent_state)` slots,
and the runner would never fill `attention_metadata.mamba_state_indices`.

`install()` wraps that method for runners serving a keras-vllm artifact
whose `config.json` lists `recurrent_state_layers` (format 1.10): those
layers get a `MambaSpec` of the declared shapes and dtypes, the others the
runner's own attention spec, every page padded to the uniform size vLLM's
hybrid allocator groups by (the same rule tpu-inference applies to its
PyTorch hybrids). The rest is the runner's model-agnostic machinery: it
allocates one `(conv, recurrent)` array pair per state layer with one slot
per running request (plus the null slot), assigns slots as requests enter
the batch and fills `mamba_state_indices` each step. State is never
rebuilt from a prefix, so prefix caching stays off for these artifacts
(`PagedRecurrentState.prefix_cacheable`), and vLLM's `mamba_cache_mode`
stays "none" (one state slot per request, `mamba_block_size` =
`max_model_len`).

Other models keep tpu-inference's method unchanged.
"""

import logging

from keras_vllm import patching

logger = logging.getLogger("keras_vllm")


def state_layers(hf_config):
    """`{layer index: (shapes, dtypes)}` from a format 1.10 `config.json`
    (empty for artifacts without recurrent state)."""
    layers = getattr(hf_config, "recurrent_state_layers", None) or ()
    shapes = tuple(
        tuple(int(d) for d in shape)
        for shape in getattr(hf_config, "recurrent_state_shapes", None) or ()
    )
    dtypes = tuple(getattr(hf_config, "recurrent_state_dtypes", None) or ())
    return {int(i): (shapes, dtypes) for i in layers}


def uniform_page_bytes(attn_page, state_page, num_attn, num_state):
    """The page size every layer's spec is padded to.

    vLLM groups the layers of each type into groups of `group_size` and
    backs one tensor per group position; tpu-inference allocates a separate
    array per layer, so each layer's page must cover one position's share:
    `attn_groups * attn_page + state_groups * state_page`. `group_size` is
    vLLM's own rule (`kv_cache_utils._get_kv_cache_groups_uniform_page_size`:
    the larger count when it is under 1.5x the smaller, else the smaller).

    Example:

    >>> uniform_page_bytes(1024, 4096, num_attn=1, num_state=3)
    13312
    """
    if not num_attn:
        return state_page
    low, high = sorted((num_attn, num_state))
    group_size = high if high < low * 1.5 else low
    attn_groups = -(-num_attn // group_size)
    state_groups = -(-num_state // group_size)
    return attn_groups * attn_page + state_groups * state_page


def _torch_dtype(name):
    import torch

    return getattr(torch, str(name))


def _on_cpu(mesh):
    return all(d.platform == "cpu" for d in mesh.devices.flatten())


def hybrid_specs(manager, original, layers):
    """The runner's attention specs, with `MambaSpec`s for `layers`."""
    import dataclasses

    from tpu_inference.core.runner_slot_mamba import (
        maybe_runner_slot_mamba_spec,
    )
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    runner = manager.runner
    cache_config = runner.cache_config
    # One state slot per request (no "align" mode: prefix caching is off).
    cache_config.mamba_cache_mode = "none"
    if cache_config.mamba_block_size is None:
        cache_config.mamba_block_size = runner.model_config.max_model_len
    manager._hybrid_uniform_page_size_bytes = None
    specs = original(manager)
    attention = [name for name in specs if _index(name) not in layers]
    shapes, dtypes = next(iter(layers.values()))
    state = MambaSpec(
        shapes=shapes,
        dtypes=tuple(_torch_dtype(d) for d in dtypes),
        block_size=cache_config.mamba_block_size,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode="none",
    )
    state_page = state.page_size_bytes
    attn_page = specs[attention[0]].page_size_bytes if attention else 0
    uniform = uniform_page_bytes(
        attn_page, state_page, len(attention), len(layers)
    )
    manager._hybrid_uniform_page_size_bytes = int(uniform)
    cache_config.mamba_page_size_padded = int(uniform)
    # Attention specs again, now padded to the uniform page.
    specs = original(manager)
    if attention and not _on_cpu(runner.mesh):
        # Size the state pool (one slot per request) and the attention
        # pool out of the device budget, as tpu-inference does for its
        # hybrids. On CPU the engine's own cap plans the cache
        # (`keras_vllm.cpu.kv_capacity`) and the runner's default pool of
        # `max_num_seqs + 1` slots is what a step can use
        # (`max_num_seqs * (num_speculative_tokens + 1) + 1` when
        # speculating: a state per draft position).
        manager._maybe_set_compact_mamba_num_blocks_override(
            attn_page, state_page, len(attention), len(layers)
        )
    for name in list(specs):
        if _index(name) in layers:
            specs[name] = maybe_runner_slot_mamba_spec(
                dataclasses.replace(state, page_size_padded=int(uniform)),
                runner.vllm_config,
            )
    missing = set(layers) - {_index(name) for name in specs}
    if missing:
        from keras_vllm.errors import ServingError

        raise ServingError(
            f"The artifact declares recurrent state for layers "
            f"{sorted(missing)}, but vLLM sized caches for "
            f"{len(specs)} layers. Re-export the model."
        )
    logger.info(
        "keras-vllm: %d recurrent-state layers (%d bytes per sequence "
        "each), %d attention layers; pages padded to %d bytes.",
        len(layers), state_page, len(attention), uniform,
    )
    return specs


def _index(name):
    prefix, _, index = name.partition(".")
    return int(index) if prefix == "layer" and index.isdigit() else None


def install():
    """Wraps tpu-inference's spec method (idempotent; keras-vllm's vLLM
    plugin calls it in every vLLM process)."""
    from tpu_inference.runner import kv_cache_manager as module

    patching.replace(
        module.KVCacheManager, "get_kv_cache_spec", _with_state_layers
    )


def _with_state_layers(original):

    def get_kv_cache_spec(self):
        from keras_vllm.serve.hf_config import serves_artifact

        model_config = self.runner.model_config
        if serves_artifact(model_config):
            layers = state_layers(model_config.hf_config)
            if layers:
                return hybrid_specs(self, original, layers)
        return original(self)

    return get_kv_cache_spec
