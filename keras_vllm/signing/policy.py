"""The signature policy of a reader: which key an artifact must be signed by.

A reader (the Keras loader, the engine, the vLLM tokenizer adapter and
model class, plain `vllm serve`'s refusal check) calls `require_signature`
before it reads anything else of an artifact. The key is the caller's
`public_key=`, else `KERAS_VLLM_PUBLIC_KEY`; with neither, unsigned
artifacts are read as before (and model-signing is not even imported).
"""

from keras_vllm import envs


def public_key_for(public_key=None):
    """`(key, who_requires_it)`: the caller's key, else the environment's."""
    if public_key is not None:
        return public_key, "public_key="
    key = envs.PUBLIC_KEY.get()
    return key, (envs.PUBLIC_KEY.name if key is not None else None)


def require_signature(directory, public_key=None):
    """Refuses an artifact not signed by the key the policy names.

    Args:
        directory: the artifact directory.
        public_key: the caller's public key path; None falls back to
            `KERAS_VLLM_PUBLIC_KEY`.

    Returns:
        The verified signature's path, or None when no policy is set.

    Raises:
        SignatureError: the artifact is unsigned, signed by another key, or
            changed after signing.
    """
    key, source = public_key_for(public_key)
    if key is None:
        return None
    from keras_vllm.signing.verify import verify_signature

    return verify_signature(directory, key, required_by=source)
