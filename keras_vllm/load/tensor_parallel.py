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
        state_heads = _state_heads(config)
        if state_heads is not None and any(h % size for h in state_heads):
            key_heads, value_heads = state_heads
            sizes = ", ".join(
                str(s)
                for s in range(1, _LISTED_UP_TO + 1)
                if key_heads % s == 0 and value_heads % s == 0
            )
            return (
                f"linear-attention heads do not split over {size}",
                f"tensor_parallel_size={size} cannot serve {where}: its "
                f"linear-attention layers have {key_heads} key heads and "
                f"{value_heads} value heads, and tensor parallelism splits "
                "both by heads (each must divide by the size). Sizes that "
                f"work: {sizes}.",
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


def _state_heads(config):
    """`(key heads, value heads)` of the recurrent-state layers (format
    1.10), from their state shapes: a gated-delta-rule state is `[value
    heads, key_head_dim, value_head_dim]` and its conv window spans the
    `[Q | K | V]` channels, `2 * key_dim + value_dim`. None when the shapes
    are not that layout."""
    shapes = config.get("recurrent_state_shapes") or ()
    if len(shapes) != 2 or len(shapes[0]) != 2 or len(shapes[1]) != 3:
        return None
    channels = int(shapes[0][1])
    value_heads, key_head_dim, value_head_dim = (int(d) for d in shapes[1])
    key_channels = channels - value_heads * value_head_dim
    if key_channels <= 0 or key_channels % (2 * key_head_dim):
        return None
    return key_channels // (2 * key_head_dim), value_heads


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

