"""The per-step serving context that paged layers read.

vLLM hands the model one flat ragged batch per step: token ids, their
positions, the attention metadata and one KV cache per attention layer.
KerasHub's backbone graph has no arguments for these, so the model class
opens a `ServingContext` around the backbone call and paged layers read it.
The context is plain Python state that only lives while the step is being
traced; nothing in it is a JAX side effect.
"""

import contextlib
import threading

_local = threading.local()


class ServingContext:
    """State of one forward step over vLLM's flat token batch.

    Args:
        kv_caches: list of KV cache arrays, one per attention layer.
        attention_metadata: tpu-inference's `AttentionMetadata`, or its
            `GroupedAttentionMetadata` (`{"layer.{i}": AttentionMetadata}`)
            when vLLM made several KV cache groups (layers with a recurrent
            state beside attention layers): each group has its own block
            tables, the rest is the step's. `attention_metadata` is then
            the first layer's; `metadata(layer)` is each layer's own.
        positions: int32 array `[T]`, each token's position in its sequence.
        mesh: the device mesh the model runs on.
        lora_slots: int32 array `[T]`, each token's LoRA adapter slot (0:
            none), or None when no adapters are served
            (`keras_vllm.layers.common.lora_slots`).
        cache_of_layer: for each attention layer (in backbone order), the
            index of its KV cache in `kv_caches` (vLLM's
            `layer_name_to_kvcache_index`); layers that share a cache map
            to the same index. None: layer i uses cache i.
        attend_until: `int32[T]`, each token's last visible key position
            when some tokens see past their own (image placeholders that
            attend to their whole image), or None (every token causal).
        prompt_lengths: `int32[T]`, each token's request's prompt length,
            for models with a layer that reads it
            (`PagedAttention.needs_prompt_lengths`), else None. In steps
            where every token decodes the runner may pass the positions
            instead (`keras_vllm.serve.worker.prompt_lengths`): a
            generated token's position is at least its prompt length, so
            `max(prompt_lengths, positions + 1)`, a token's sequence length
            counting the whole prompt, is the same either way.
        state_window: recurrent-state slots per request: the engine's
            `num_speculative_tokens + 1`, a state kept per draft position
            (`gated_delta_rule.conv1d_gdn_windowed`); 1 without speculation.
    """

    def __init__(self, kv_caches, attention_metadata, positions, mesh=None,
                 lora_slots=None, cache_of_layer=None, attend_until=None,
                 prompt_lengths=None, state_window=1):
        self.kv_caches = list(kv_caches)
        self.state_window = int(state_window)
        self.attend_until = attend_until
        self.prompt_lengths = prompt_lengths
        self.lora_slots = lora_slots
        self._grouped = None
        if isinstance(attention_metadata, dict):
            self._grouped = attention_metadata
            attention_metadata = attention_metadata[_layer_name(0)]
        self.attention_metadata = attention_metadata
        self.positions = positions
        self.mesh = mesh
        if cache_of_layer is None:
            cache_of_layer = range(len(self.kv_caches))
        self.cache_of_layer = list(cache_of_layer)
        self.calls = [0] * len(self.cache_of_layer)
        self.writes = [0] * len(self.kv_caches)

    def replicas(self):
        """How many data-parallel replicas share the step's flat batch.

        With data parallelism tpu-inference runs one program over a
        `(data, model)` mesh: the flat batch is the replicas' padded token
        blocks one after the other (split over the `data` axis), and each
        metadata array is the replicas' own arrays concatenated (requests
        and `query_start_loc` offsets local to each block).
        """
        if self.mesh is None:
            return 1
        from tpu_inference.layers.common.sharding import ShardingAxisName
        from tpu_inference.utils import get_mesh_shape_product

        return int(get_mesh_shape_product(self.mesh, ShardingAxisName.ATTN_DATA))

    def real_tokens(self):
        """A `[T]` bool mask of the step's real tokens: vLLM pads each
        replica's block of the flat batch up to a token bucket, and layers
        that route tokens (mixture of experts) skip the padding. None when
        the metadata lacks it."""
        import jax.numpy as jnp

        metadata = self.attention_metadata
        starts = getattr(metadata, "query_start_loc", None)
        distribution = getattr(metadata, "request_distribution", None)
        if starts is None or distribution is None:
            return None
        replicas = self.replicas()
        # [decode, decode + prefill, requests] per replica.
        starts = jnp.reshape(starts, (replicas, -1))
        requests = jnp.reshape(distribution, (replicas, 3))[:, 2:3]
        counts = jnp.take_along_axis(starts, requests, axis=1)[:, 0]
        tokens = self.positions.shape[0]
        index = jnp.arange(tokens)
        block = tokens // replicas
        return index % block < counts[index // block]

    def token_requests(self):
        """Each token's request, as an index into the step's `seq_lens`,
        `[T]` int32 (padding tokens get some valid index)."""
        import jax
        import jax.numpy as jnp

        metadata = self.attention_metadata
        replicas = self.replicas()
        starts = jnp.reshape(metadata.query_start_loc, (replicas, -1))
        per_replica = starts.shape[1] - 1
        tokens = self.positions.shape[0]
        local = jnp.reshape(jnp.arange(tokens) % (tokens // replicas),
                            (replicas, -1)).astype(starts.dtype)
        request = jax.vmap(
            lambda s, t: jnp.searchsorted(s, t, side="right") - 1
        )(starts, local)
        request = jnp.clip(request, 0, per_replica - 1)
        offsets = jnp.arange(replicas, dtype=request.dtype)[:, None]
        return jnp.reshape(request + offsets * per_replica, (-1,))

    def metadata(self, layer):
        """The attention metadata of layer `layer` (vLLM's `layer.{i}`):
        its KV cache group's block tables with the step's positions,
        sequence lengths and state slots."""
        if self._grouped is None:
            return self.attention_metadata
        return self._grouped[_layer_name(layer)]

    def _index(self, layer):
        index = (
            self.cache_of_layer[layer]
            if 0 <= layer < len(self.cache_of_layer)
            else -1
        )
        if not 0 <= index < len(self.kv_caches):
            raise RuntimeError(
                f"Paged attention layer {layer} has no KV cache among the "
                f"{len(self.kv_caches)} vLLM allocated. The artifact's "
                "config.json and the backbone disagree on the attention "
                "layers."
            )
        return index

    def read_cache(self, layer):
        """The KV cache attention layer `layer` attends over."""
        return self.kv_caches[self._index(layer)]

    def write_cache(self, layer, value):
        """Stores the cache attention layer `layer` wrote this step."""
        index = self._index(layer)
        self.kv_caches[index] = value
        self.calls[layer] += 1
        self.writes[index] += 1

    def mark_read(self, layer, passed_on=None):
        """Records that a layer sharing another's cache ran (no write).

        Args:
            layer: the sharing layer's index.
            passed_on: the cache the layer's kernel returned for the one it
                read, unchanged, if any. It replaces the source's entry:
                tpu-inference's attention kernel aliases its cache input to
                that output even when it writes nothing, so if the step
                kept the input instead, XLA would first copy the whole
                cache, once per sharing layer (on a TPU, where the caches
                fill most of the chip's memory: out of memory in the first
                step, seen with Gemma 3n).
        """
        index = self._index(layer)
        self.calls[layer] += 1
        if passed_on is not None:
            self.kv_caches[index] = passed_on

    def check_all_used_once(self):
        """Fails loudly if a layer was skipped or ran twice in one step, or
        a cache was written other than once."""
        bad = [i for i, n in enumerate(self.calls) if n != 1]
        if bad:
            raise RuntimeError(
                "Paged attention ran "
                + ", ".join(f"{self.calls[i]} times for layer {i}" for i in bad)
                + "; every attention layer must run exactly once per step. "
                "A layer of this backbone bypasses its paged subclass."
            )
        bad = [i for i, n in enumerate(self.writes) if n != 1]
        if bad:
            raise RuntimeError(
                "KV caches "
                + ", ".join(f"{i} ({self.writes[i]} writes)" for i in bad)
                + " were not written exactly once this step; the layers "
                "sharing caches disagree with vLLM's cache map."
            )


def _layer_name(index):
    # The JAX model path names vLLM's layers `layer.{i}`.
    return f"layer.{index}"


def current_context():
    """Returns the active `ServingContext`, or None outside serving."""
    return getattr(_local, "context", None)


@contextlib.contextmanager
def serving_context(context):
    """Makes `context` the active serving context within the block."""
    previous = current_context()
    _local.context = context
    try:
        yield context
    finally:
        _local.context = previous


def require_context(layer):
    context = current_context()
    if context is None:
        raise RuntimeError(
            f"{type(layer).__name__} is a paged (vLLM) layer and runs only "
            "inside a serving step. Use the original KerasHub model for "
            "dense inference."
        )
    return context
