"""The tpu-inference drafter class that serves a keras-vllm assistant.

tpu-inference 0.32 drafts for `method: "mtp"` with its `Eagle3Proposer`
(`spec_decode/jax/eagle3.py`), which loads the draft model through its
model registry (this class, under `ASSISTANT_ARCHITECTURE`) and calls it
once per drafted token:

    model(kv_caches, input_ids, target_hidden_states, attention_metadata,
          layer_name_to_kvcache_index) -> (kv_caches, hidden, [residual], _)

where, for the first draft of a step, `input_ids` are the sequence shifted
by one (each position's next token, the last the token just sampled),
`target_hidden_states` the target model's output at each position (what
`KerasVllmForCausalLM` returns: the backbone's final-normed hidden states,
the `hidden_states` Keras' `Gemma4CausalLM.generate()` feeds its assistant
too); for the next drafts, the last draft token and this class' `residual`
(the assistant's `post_projection` output), at the same positions
(`use_gemma4_mtp()`: positions stay those of the verified token). The
proposer takes `compute_logits(hidden)`'s argmax as the draft.

The assistant's layers attend over the target's caches: vLLM's runner maps
`draft_layer.{i}` to the cache of the target's last layer of the same kind
(`kv_share.compute_mtp_kv_share_map`, from the two configs' `layer_types`
and the target's `num_kv_shared_layers`) and passes that map as
`layer_name_to_kvcache_index`. The paged layers are the target family's
own (`keras_vllm/layers/`): an assistant layer is a KV-shared layer, which
reads its cache and writes nothing.

The assistant's input embedding is the target's (its token embedding
times the square root of the target's width, as Keras' `generate()`
computes it, quantized when the served target is): this class takes the
served model's embedding layer and verified artifact from the runner
(`draft_target`), and drafts with the served embedding's own arrays.
"""

import logging

import jax
import jax.numpy as jnp
from flax import nnx
from keras import ops

from keras_vllm.errors import ServingError
from keras_vllm.layers.common.context import ServingContext
from keras_vllm.layers.common.context import serving_context
from keras_vllm.layers.swap import swap_in_paged_layers
from keras_vllm.load.assistant import check_fits
from keras_vllm.load.assistant import load_assistant
from keras_vllm.format import assistant as assistant_format
from keras_vllm import format as fmt
from keras_vllm.serve.worker import draft_target
from keras_vllm.serve.worker.model import KerasVllmForCausalLM

logger = logging.getLogger("keras_vllm")


class KerasVllmAssistantForCausalLM(nnx.Module):
    """Drafts with a keras-vllm assistant artifact for its target.

    Args:
        vllm_config: vLLM's `VllmConfig`; `speculative_config.
            draft_model_config.model` is the assistant artifact,
            `model_config.model` the target artifact.
        rng_key: unused (weights come from the artifacts).
        mesh: the JAX device mesh.
    """

    def __init__(self, vllm_config, rng_key=None, mesh=None):
        self.vllm_config = vllm_config
        self.mesh = mesh
        draft = vllm_config.speculative_config.draft_model_config
        self._assistant_path = draft.model
        self._target_path = vllm_config.model_config.model
        self.dtype_name = jnp.dtype(vllm_config.model_config.dtype).name

    def load_weights(self, *args, **kwargs):
        """Builds the assistant (verified, checked against the served
        target) beside a copy of the target's token embedding, and swaps
        in paged layers."""
        target = self._served_target()
        manifest, _ = assistant_format.read_assistant(self._assistant_path)
        # The served artifact, verified when the target loaded: its config
        # is read from there (parsed then, or hashed as it is read now).
        check_fits(
            manifest, target.artifact.read_json(fmt.CONFIG_FILE),
            target.artifact_path, self._assistant_path,
        )
        assistant = load_assistant(
            self._assistant_path, dtype=self.dtype_name, verify=False
        )
        # A clone of the served layer (quantized when the target is), on
        # its own arrays until `share_target_weights` gives it the served
        # ones (see `draft_target`).
        self.target_embedding = _detached(target.backbone.token_embedding)
        self.embedding_scale = float(target.backbone.hidden_dim) ** 0.5
        self.attention_layers = len(swap_in_paged_layers(assistant.backbone))
        # The assistant's parts, not the assistant: a functional Keras
        # model keeps dicts keyed by layers, which NNX cannot flatten.
        self.backbone = assistant.backbone
        self.pre_projection = assistant.pre_projection
        self.post_projection = assistant.post_projection
        self.centroids = assistant.centroids
        self.token_ordering = assistant.token_ordering
        self.centroid_head = (
            type(assistant)._apply_centroid_logits
            if assistant.use_ordered_embeddings else None
        )
        self.centroid_settings = {
            "num_centroids": assistant.num_centroids,
            "centroid_intermediate_top_k": (
                assistant.centroid_intermediate_top_k
            ),
            "_vocab_size_per_centroid": assistant._vocab_size_per_centroid,
        }
        self._place()
        logger.info(
            "keras-vllm: drafting with assistant %s (%d layers over the "
            "target's caches)", self._assistant_path, self.attention_layers,
        )

    def _served_target(self):
        """The runner's served model (`draft_target`), which must be a
        keras-vllm artifact's."""
        target = draft_target.served_target()
        if target is None:
            raise ServingError(
                f"The assistant '{self._assistant_path}' drafts inside "
                "tpu-inference's MTP proposer, which hands it the served "
                "model (keras_vllm.serve.worker.draft_target); it was loaded "
                "outside it. Serve the target with speculative_config="
                '{"method": "mtp", "model": ASSISTANT_DIR, ...}.'
            )
        if not isinstance(target, KerasVllmForCausalLM):
            raise ServingError(
                f"The assistant '{self._assistant_path}' drafts for a model "
                "served from a keras-vllm artifact, and this engine serves "
                f"'{self._target_path}' with {type(target).__name__}. Serve "
                "the target artifact the assistant was exported for "
                "(`export_assistant(..., target=...)`)."
            )
        return target

    def share_target_weights(self, target):
        """Points the target embedding's variables at `target`'s (the
        served arrays, no copy); `draft_target` calls it once this model
        is jitted, and after the served weights are replaced."""
        served = target.backbone.token_embedding.variables
        for own, variable in zip(
            self.target_embedding.variables, served, strict=True
        ):
            own.assign(variable.value)

    def _place(self):
        """Every variable replicated on the runner's mesh."""
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec

        if self.mesh is None:
            return
        replicated = NamedSharding(self.mesh, PartitionSpec())
        # Not the target embedding: it lies as the served one does.
        variables = [
            *self.backbone.weights,
            *self.pre_projection.weights, *self.post_projection.weights,
        ]
        if self.centroids is not None:
            variables += [*self.centroids.weights, self.token_ordering]
        for variable in variables:
            variable.assign(jax.device_put(variable.value, replicated))

    def modules(self):
        """No torch submodules."""
        return iter(())

    def __call__(
        self,
        kv_caches,
        input_ids,
        hidden_states,
        attention_metadata,
        layer_name_to_kvcache_index=None,
        *args,
    ):
        names = dict(layer_name_to_kvcache_index or ())
        caches = tuple(
            names[f"draft_layer.{i}"] for i in range(self.attention_layers)
        )
        context = ServingContext(
            kv_caches, attention_metadata, attention_metadata.input_positions,
            mesh=self.mesh, cache_of_layer=caches,
        )
        embedded = self.target_embedding(input_ids) * ops.cast(
            self.embedding_scale, hidden_states.dtype
        )
        x = self.pre_projection(
            ops.concatenate([embedded, hidden_states], axis=-1)
        )
        # vLLM's T tokens as T sequences of one token (as the target runs).
        x = ops.expand_dims(x, axis=1)
        with serving_context(context):
            for layer in self.backbone.transformer_layers:
                x = layer(x)
                x = x[0] if isinstance(x, (tuple, list)) else x
        if context.calls != [1] * self.attention_layers:
            raise RuntimeError(
                f"The assistant's paged layers ran {context.calls} times; "
                "each must run once per draft step."
            )
        hidden = self.backbone.layer_norm(x)[:, 0, :]
        residual = self.post_projection(hidden)
        return context.kv_caches, hidden, [residual], None

    def compute_logits(self, hidden_states):
        """The assistant's logits: its tied head, or its centroid head
        (only the tokens of its top centroids scored) when it has one."""
        import types

        hidden = hidden_states[:, None, :]
        if self.centroid_head is not None:
            parts = types.SimpleNamespace(
                backbone=self.backbone, centroids=self.centroids,
                token_ordering=self.token_ordering, **self.centroid_settings,
            )
            logits = self.centroid_head(parts, hidden)
        else:
            logits = self.backbone.token_embedding(hidden, reverse=True)
        return logits[:, 0, :]


def _detached(layer):
    """A copy of a Keras layer that shares no array with it.

    tpu-inference donates a loaded model's arrays when it jits it, which
    would free the served target's own had the drafter held them then.
    """
    copy = nnx.clone(layer)
    for variable in copy.variables:
        value = variable.value
        variable.assign(jax.device_put(value, value.sharding, may_alias=False))
    return copy
