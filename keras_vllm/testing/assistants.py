"""A tiny multi-token-prediction assistant for a tiny Gemma 4 target.

KerasHub's `Gemma4AssistantCausalLM` drafts from its target's state: its
layers all read the target's KV cache (the last target layer of each
kind), so they take the target's head sizes and KV heads; its input is
the target's token embedding beside the target's last hidden state.
"""

import keras

# The assistant's own width and depth (its layers' query heads and head
# sizes are the target's: they attend over the target's caches).
HIDDEN_DIM = 32
INTERMEDIATE_DIM = 64
LAYER_TYPES = ("sliding_attention", "full_attention")


def build_tiny_assistant(target, num_speculative_tokens=3, seed=7,
                         ordered_embeddings=False, **overrides):
    """A random `Gemma4AssistantCausalLM` that fits `target`.

    Args:
        target: a `keras_hub.models.Gemma4CausalLM` (e.g.
            `build_tiny_causal_lm("gemma4_e2b")`).
        num_speculative_tokens: drafts per step `generate()` uses.
        seed: the initializers' seed.
        ordered_embeddings: score with a centroid head, as the E2B / E4B
            assistants do: the vocabulary in a random order, split into 2
            centroids, both active (`centroid_intermediate_top_k=2`), so
            the head scores every token, as the tied head does, through
            the centroid gathers and scatter.
        **overrides: assistant backbone arguments (e.g. `hidden_dim`).

    Returns:
        The assistant.

    Example:

    ```python
    target = build_tiny_causal_lm("gemma4_e2b")
    assistant = build_tiny_assistant(target)
    target.generate("one two", max_length=16, assistant_model=assistant)
    ```
    """
    import keras_hub

    config = dict(target.backbone.get_config())
    for key in ("name", "trainable", "dtype"):
        config.pop(key, None)
    config.update(
        num_layers=len(LAYER_TYPES),
        hidden_dim=HIDDEN_DIM,
        intermediate_dim=INTERMEDIATE_DIM,
        layer_types=list(LAYER_TYPES),
        num_kv_shared_layers=len(LAYER_TYPES),
        hidden_size_per_layer_input=0,
        use_double_wide_mlp=False,
        enable_moe_block=False,
        num_experts=None,
        expert_intermediate_dim=None,
        vision_encoder=None,
        audio_encoder=None,
    )
    config.update(overrides)
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.Gemma4Backbone.from_config(config)
    assistant = keras_hub.models.Gemma4AssistantCausalLM(
        backbone,
        backbone_hidden_size=target.backbone.hidden_dim,
        num_centroids=2 if ordered_embeddings else 1,
        centroid_intermediate_top_k=2 if ordered_embeddings else 1,
        use_ordered_embeddings=ordered_embeddings,
        num_speculative_tokens=num_speculative_tokens,
    )
    if ordered_embeddings:
        import numpy as np

        vocabulary = backbone.vocabulary_size
        order = np.random.default_rng(seed).permutation(vocabulary)
        assistant.token_ordering.assign(order.astype("float32"))
    return assistant


def kv_sources(target):
    """`(full, sliding)`: the target layers whose caches an assistant's
    global and sliding-window layers read (the last layer of each kind
    with a cache of its own), as `Gemma4CausalLM.generate()` finds them."""
    full = local = None
    types = target.backbone.layer_types or []
    for i, layer in enumerate(target.backbone.transformer_layers):
        if not getattr(layer, "is_kv_shared_layer", False):
            if i < len(types) and types[i] == "full_attention":
                full = i
            else:
                local = i
    return full, local


def fine_tune_assistant(assistant, target, steps=300, learning_rate=1e-2,
                        seed=0):
    """Trains `assistant` to draft `target`'s greedy tokens (distillation).

    Each step takes one position `p` of the tokenized corpus: the assistant
    gets the target's embedding of token `p + 1` and its hidden state at
    `p`, attends over the target's cache at position `p` (the input vLLM's
    MTP proposer gives it for the token after a verified one) and learns
    the target's argmax at `p + 1`.

    Args:
        assistant: a `Gemma4AssistantCausalLM` fitting `target`.
        target: the (fine-tuned) `Gemma4CausalLM`.
        steps: optimizer steps.
        learning_rate: Adam's learning rate.
        seed: picks the positions.

    A centroid head is trained as the tied head it scores through (the
    dense logits; the centroid router is left as built).

    Returns:
        The losses, one per step.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from keras import ops

    from keras_vllm.testing.training import tokenize_corpus

    x, _, _ = tokenize_corpus(target.preprocessor.tokenizer)
    ids = ops.convert_to_tensor(x["token_ids"])
    mask = jnp.asarray(x["padding_mask"], "float32")
    hidden, cache = target._build_cache(
        ids, None, None, ops.convert_to_tensor(x["padding_mask"]), None
    )
    labels = jnp.argmax(
        target.backbone.token_embedding(hidden, reverse=True), axis=-1
    )
    scale = float(target.backbone.hidden_dim) ** 0.5
    embedded = target.backbone.token_embedding(ids) * scale
    full, local = kv_sources(target)
    trainable = assistant.trainable_variables
    fixed = [(v, v.value) for v in assistant.non_trainable_variables]

    def loss_fn(values, p):
        mapping = list(zip(trainable, values)) + fixed
        with keras.StatelessScope(state_mapping=mapping):
            logits, _ = assistant.call_with_cache(
                last_token_embedding=jax.lax.dynamic_slice_in_dim(
                    embedded, p + 1, 1, axis=1),
                last_hidden_state=jax.lax.dynamic_slice_in_dim(
                    hidden, p, 1, axis=1),
                target_cache=cache,
                cache_update_index=p,
                target_kv_source_full_idx=full,
                target_kv_source_local_idx=local,
            )
        label = jax.lax.dynamic_index_in_dim(labels, p + 1, 1, False)
        weight = jax.lax.dynamic_index_in_dim(mask, p + 1, 1, False)
        log_probs = jax.nn.log_softmax(logits[:, 0].astype("float32"))
        loss = -jnp.take_along_axis(log_probs, label[:, None], axis=1)[:, 0]
        return jnp.sum(loss * weight) / jnp.maximum(jnp.sum(weight), 1.0)

    values = [v.value for v in trainable]
    # Adam (beta1 0.9, beta2 0.999), written out: the testing module needs
    # no optimizer library.
    state = (
        [jnp.zeros_like(v) for v in values],
        [jnp.zeros_like(v) for v in values],
        jnp.float32(0.0),
    )

    @jax.jit
    def step(values, state, p):
        loss, grads = jax.value_and_grad(loss_fn)(values, p)
        first, second, count = state
        count = count + 1
        first = [0.9 * m + 0.1 * g for m, g in zip(first, grads)]
        second = [0.999 * v + 0.001 * g * g for v, g in zip(second, grads)]
        rate = learning_rate * jnp.sqrt(1 - 0.999**count) / (1 - 0.9**count)
        values = [
            w - rate * m / (jnp.sqrt(v) + 1e-8)
            for w, m, v in zip(values, first, second)
        ]
        return values, (first, second, count), loss

    positions = np.random.default_rng(seed).integers(
        0, ids.shape[1] - 2, size=steps
    )
    losses = []
    ordered = assistant.use_ordered_embeddings
    assistant.use_ordered_embeddings = False
    try:
        for p in positions:
            values, state, loss = step(values, state, jnp.int32(p))
            losses.append(float(loss))
    finally:
        assistant.use_ordered_embeddings = ordered
    for variable, value in zip(trainable, values):
        variable.assign(value)
    return losses
