"""What a manifest says about serving the artifact: the modalities requests
may carry, the inputs the served model leaves out, and whether vLLM may
reuse cached KV blocks across requests. Readers of older artifacts get the
defaults those versions served with."""


def served_modalities(manifest):
    """What requests to the artifact may hold (1.5 and older: text)."""
    return list(manifest.get("modalities", {}).get("served", ["text"]))


def prefix_caching(manifest):
    """Whether the artifact may be served with vLLM's prefix caching (1.7
    and older: yes, as they were; the worker refuses it for models whose
    paged layers say otherwise)."""
    return bool(manifest.get("prefix_caching", True))


def no_prefix_caching_message(path):
    """Why `path` is served without prefix caching, and how to serve it."""
    return (
        f"'{path}' cannot be served with prefix caching: its attention keys "
        "depend on how long the sequence was when they were computed (a "
        "rotary embedding whose factors follow the sequence length), so "
        "blocks cached by another request would change the output. Serve it "
        "with `enable_prefix_caching=False` (`vllm serve PATH "
        "--no-enable-prefix-caching`); keras-vllm's engine and `keras-vllm "
        "serve` set that for artifacts of format 1.8 and later."
    )


def unserved_inputs(manifest):
    """The backbone inputs the served model does not take (none before 1.6):
    when any, the artifact serves its text decoder alone."""
    return list(manifest.get("modalities", {}).get("unserved_inputs", []))
