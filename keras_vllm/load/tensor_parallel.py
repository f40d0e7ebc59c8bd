"""Which tensor-parallel sizes an artifact can be served with.

tpu-inference splits attention over the mesh's `model` axis by heads: query
heads must divide by the TP size, and key/value heads either divide by it or
divide it (fewer KV heads than devices are repeated, as in its
`get_padded_num_heads`). Anything else would fail deep inside the runner
after minutes of loading, so serving entry points check here first, from the
head counts in the artifact's `config.json` (no JAX, no model build).
"""

from keras_vllm.errors import ServingError

# Sizes listed in messages: every power of two a TPU slice offers and more.
_LISTED_UP_TO = 64


def _as_size(value):
    """A requested size as an int (0, never valid, when it is not one)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def shardable(num_heads, num_kv_heads, size):
    """Whether attention with these heads splits over `size` devices."""
    if size < 1 or num_heads % size:
        return False
    return num_kv_heads % size == 0 or size % num_kv_heads == 0


def valid_sizes(num_heads, num_kv_heads, up_to=_LISTED_UP_TO):
    """Every TP size up to `up_to` these heads can be served with."""
    return [
        size
        for size in range(1, up_to + 1)
        if shardable(num_heads, num_kv_heads, size)
    ]


def refusal(config, size, where="this artifact"):
    """Why `size` devices cannot serve the artifact, or None when they can.

    The one check serving runs (`check_tensor_parallel`) and `keras-vllm
    inspect` lists, so the two never disagree.

    Args:
        config: the artifact's parsed `config.json`.
        size: the tensor-parallel size.
        where: the artifact, as the message names it.

    Returns:
        None, or `(reason, message)`: a short reason (a table cell) and the
        full message, naming the fix.
    """
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    size = _as_size(size)
    vocabulary = int(config.get("vocab_size") or 0)
    if size > 1 and vocabulary % size:
        # tpu-inference splits the logits over the vocabulary on every TP
        # size; an uneven split fails in XLA minutes into the start.
        return (
            f"the vocabulary ({vocabulary} tokens) does not divide by {size}",
            f"tensor_parallel_size={size} cannot serve {where}: its "
            f"vocabulary has {vocabulary} tokens, and vLLM's TPU backend "
            "splits the logits over the vocabulary, which must divide by "
            "the size. Serve it on one device, or pad the vocabulary (e.g. "
            "resize the token embedding to a multiple of the size) before "
            "fine-tuning.",
        )
    if size > 1 and config.get("recurrent_state_layers"):
        # A state layer's fused `[Q | K | V]` projection and conv channels
        # would have to be reordered per shard (format 1.10 layers).
        return (
            "layers with a recurrent state are not split yet",
            f"tensor_parallel_size={size} cannot serve {where}: its layers "
            "with a recurrent state (linear attention) are served on one "
            "device only for now. Serve it with tensor_parallel_size=1.",
        )
    # Full-attention layers may have their own KV head count (format 1.7).
    global_kv = int(config.get("num_global_key_value_heads") or kv_heads)
    if shardable(heads, kv_heads, size) and shardable(heads, global_kv, size):
        return None
    if not shardable(heads, global_kv, size):
        kv_heads = global_kv
    sizes = ", ".join(str(s) for s in valid_sizes(heads, kv_heads))
    return (
        f"attention heads do not split over {size}",
        f"tensor_parallel_size={size} cannot serve {where}: its attention "
        f"has {heads} query heads and {kv_heads} key/value heads, and "
        "tensor parallelism splits attention by heads (query heads must "
        "divide by the size; key/value heads must divide by it or divide "
        f"it). Sizes that work: {sizes}.",
    )


def check_tensor_parallel(config, size, where):
    """Refuses a TP size the artifact cannot be split over (`refusal`).

    Args:
        config: the artifact's parsed `config.json`.
        size: the requested tensor-parallel size.
        where: the artifact, as the message names it.

    Raises:
        ServingError: naming the head counts or vocabulary and what works.
    """
    refused = refusal(config, size, where)
    if refused is not None:
        raise ServingError(refused[1])

