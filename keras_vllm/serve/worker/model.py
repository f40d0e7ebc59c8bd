"""The tpu-inference model class that serves a keras-vllm artifact.

It is a flax NNX module whose state is the Keras backbone's own variables
(with `KERAS_NNX_ENABLED=true` every Keras variable is an `nnx.Variable`),
so tpu-inference's `nnx.split` / `jax.jit` machinery carries the weights
with no conversion. Each attention layer of the backbone is re-classed as
its paged subclass (see `keras_vllm/layers/`), and the backbone's own graph
runs over vLLM's flat ragged batch.
"""

import logging

import jax.numpy as jnp
from flax import nnx
from keras import ops

from keras_vllm import envs
from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.errors import ServingError
from keras_vllm.export.capabilities import backbone_input_names
from keras_vllm.layers.common.base import cache_of_layer
from keras_vllm.layers.common.context import ServingContext
from keras_vllm.layers.common.context import serving_context
from keras_vllm.layers.swap import memory_spec
from keras_vllm.layers.swap import needs_prompt_lengths
from keras_vllm.layers.swap import prefix_cacheable
from keras_vllm.layers.swap import swap_in_paged_layers
from keras_vllm.load.keras_loader import build_backbone
from keras_vllm.load.opening import open_verified
from keras_vllm.load.text_decoder import served_backbone
from keras_vllm.serve.worker.adapter_slots import install_adapter_slots
from keras_vllm.serve.worker.adapter_slots import token_slots
from keras_vllm.serve.worker.sharding import shard_backbone
from keras_vllm.serve.worker import model_inspection
from keras_vllm.serve.worker.warm_start import register_model

logger = logging.getLogger("keras_vllm")


class KerasVllmForCausalLM(nnx.Module):
    """Serves the backbone of a keras-vllm artifact on tpu-inference.

    tpu-inference constructs the class under `nnx.eval_shape`, so the
    constructor only records settings; `load_weights` builds the backbone
    eagerly from the artifact (verified first) in the dtype vLLM resolved.

    Args:
        vllm_config: vLLM's `VllmConfig`; `model_config.model` is the
            artifact directory.
        rng_key: unused (weights come from the artifact).
        mesh: the JAX device mesh.
    """

    def __init__(self, vllm_config, rng_key=None, mesh=None):
        self.vllm_config = vllm_config
        self.mesh = mesh
        self._model_path = vllm_config.model_config.model
        # The served `keras_vllm.format.Artifact` (set by `load_weights`,
        # replaced by a live update).
        self.artifact = None
        self.dtype_name = jnp.dtype(vllm_config.model_config.dtype).name
        # Recurrent-state slots per request: with speculation the runner
        # gives each request `num_speculative_tokens + 1`
        # (tpu-inference's `mamba_blocks_per_request`), a state per draft
        # position. Static for the engine's life, so fixed at trace time.
        speculative = vllm_config.speculative_config
        self.state_window = 1 + (
            int(speculative.num_speculative_tokens or 0) if speculative else 0
        )

    def load_weights(self, *args, **kwargs):
        """Builds the backbone from the artifact and swaps in paged layers."""
        # Never live lines from vLLM's engine process: other processes
        # share its terminal. `keras-vllm serve` asks for one line per
        # phase; otherwise phases only log at INFO.
        lines = envs.ENGINE_PROGRESS.get() == "lines"
        with progress.verbosity("lines" if lines else False):
            artifact = open_verified(self._model_path, verbose="auto")
            manifest = artifact.manifest
            backbone = build_backbone(
                artifact,
                dtype=self.dtype_name,
                preset=envs.PRESET.get(),
                # An adapter is served merged into the base's kernels: the
                # paged layers call the plain projections.
                merge_lora=True,
            )
            backbone = self.served_backbone(backbone, manifest)
        if self.vllm_config.cache_config.enable_prefix_caching and not (
            prefix_cacheable(backbone)
        ):
            # An artifact older than format 1.8 says nothing about it.
            raise ServingError(fmt.no_prefix_caching_message(self._model_path))
        # Phi-3's "su" RoPE: the runner passes each token's prompt length.
        self.uses_prompt_lengths = needs_prompt_lengths(backbone)
        attention = swap_in_paged_layers(backbone)
        self.attention_layers = len(attention)
        # Which cache each layer uses when vLLM passes no map (layers that
        # share a cache read their source's).
        # (A layer with a recurrent state has its own state slots.)
        self.default_cache_of_layer = tuple(
            cache_of_layer(
                [memory_spec(type(layer), layer) for layer in attention]
            )
        )
        # vLLM's positions go in as `position_ids` too, for backbones that
        # take them (their rotary layers read the input).
        self.feeds_positions = "position_ids" in backbone_input_names(backbone)
        self.artifact = artifact
        register_model(self.vllm_config, manifest)
        # `repr(llm)` (a notebook showing `engine.llm`) describes the model.
        # Installed here, in the worker: importing tpu-inference's worker
        # module from the plugin would start JAX before vLLM forks.
        model_inspection.install()
        self.lora_layers = install_adapter_slots(
            backbone, self.vllm_config.lora_config, self.dtype_name
        )
        # Every variable on the runner's mesh (split for tensor parallelism,
        # replicated otherwise): the jitted step takes them as they lie.
        self.placement = shard_backbone(backbone, self.mesh)
        self.backbone = backbone
        logger.info(
            "keras-vllm: serving %s (%d attention layers, %s)",
            type(backbone).__name__,
            self.attention_layers,
            self.dtype_name,
        )

    def served_backbone(self, backbone, manifest):
        """The backbone this class runs: a model with encoders (a vision
        tower) serves its text decoder here."""
        return served_backbone(backbone, manifest)

    @property
    def artifact_path(self):
        """The served artifact's directory."""
        if self.artifact is None:
            return self._model_path
        return self.artifact.path

    @property
    def manifest(self):
        """The served artifact's manifest."""
        return self.artifact.manifest

    def describe(self):
        """A short text of what is served: vLLM's `LLM.__repr__` shows it
        (`keras_vllm.serve.worker.model_inspection`)."""
        backbone = getattr(self, "backbone", None)
        if backbone is None:
            return f"KerasVllmForCausalLM(artifact={self.artifact_path!r})"
        config = backbone.get_config()
        shape = ", ".join(
            f"{key}={config[key]}"
            for key in ("num_layers", "hidden_dim", "vocabulary_size")
            if key in config
        )
        count = self.manifest.get("parameter_count")
        return (
            f"KerasVllmForCausalLM(\n"
            f"  artifact={self.artifact_path!r},\n"
            f"  backbone={type(backbone).__name__}({shape}),\n"
            f"  parameters={count}, dtype={self.dtype_name}, "
            f"paged_attention_layers={self.attention_layers}\n)"
        )

    def __call__(
        self,
        kv_caches,
        input_ids,
        attention_metadata,
        inputs_embeds=None,
        input_positions=None,
        layer_name_to_kvcache_index=None,
        lora_metadata=None,
        intermediate_tensors=None,
        is_first_rank=True,
        is_last_rank=True,
        *args,
        **kwargs,
    ):
        context = self._serving_context(
            kv_caches, attention_metadata, lora_metadata,
            layer_name_to_kvcache_index, input_positions,
        )
        positions = context.positions
        # vLLM's T tokens run as T sequences of one token: the backbone's
        # masks stay [T, 1, 1] and positions come from the context.
        token_ids = ops.expand_dims(input_ids, axis=-1)
        inputs = {
            "token_ids": token_ids,
            "padding_mask": ops.ones_like(token_ids),
        }
        if self.feeds_positions:
            inputs["position_ids"] = ops.expand_dims(
                ops.cast(positions, "int32"), axis=-1
            )
        with serving_context(context):
            hidden = self.backbone(inputs, training=False)
        context.check_all_used_once()
        return context.kv_caches, hidden[:, 0, :], [], None

    def _serving_context(self, kv_caches, attention_metadata, lora_metadata,
                         layer_name_to_kvcache_index, input_positions=None):
        """The step's `ServingContext`, as every served model class opens it.

        For a model with a layer that reads prompt lengths, the runner
        passes them as `input_positions`, an argument keras-vllm's models
        take their positions from the attention metadata instead of
        (`keras_vllm.serve.worker.prompt_lengths`)."""
        # Several KV cache groups (attention beside recurrent-state
        # layers): a dict of per-layer metadata, positions the same in all.
        first = (
            attention_metadata["layer.0"]
            if isinstance(attention_metadata, dict) else attention_metadata
        )
        positions = first.input_positions
        return ServingContext(
            kv_caches, attention_metadata, positions, mesh=self.mesh,
            lora_slots=token_slots(lora_metadata, positions.shape[0])
            if getattr(self, "lora_layers", 0) else None,
            cache_of_layer=self._cache_of_layer(layer_name_to_kvcache_index),
            prompt_lengths=input_positions
            if getattr(self, "uses_prompt_lengths", False) else None,
            state_window=self.state_window,
        )

    def _cache_of_layer(self, layer_name_to_kvcache_index):
        """Each attention layer's cache index: vLLM's map (`layer.{i}` ->
        index, KV-shared layers pointing at their source's cache) when the
        runner passes one, else the artifact's own."""
        names = dict(layer_name_to_kvcache_index or ())
        if not names:
            return self.default_cache_of_layer
        return tuple(
            names[f"layer.{i}"] for i in range(self.attention_layers)
        )

    def modules(self):
        """No torch submodules (vLLM's in-process engine walks them at
        exit to release torch.compile hooks)."""
        return iter(())

    def compute_logits(self, hidden_states):
        """Logits from the backbone's own output head (tied or not, with the
        family's final soft-cap when it has one)."""
        logits = self.backbone.token_embedding(
            hidden_states[:, None, :], reverse=True
        )
        return logits[:, 0, :]
