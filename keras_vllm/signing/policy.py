"""The signature policy of a reader: which key an artifact must be signed by.

A reader (the Keras loader, the engine, the vLLM tokenizer adapter and
model class, plain `vllm serve`'s refusal check) calls `require_signature`
before it reads anything else of an artifact. The key is the caller's
`public_key=`, else `KERAS_VLLM_PUBLIC_KEY`; with neither, unsigned
artifacts are read as before (and model-signing is not even imported).
"""

import os

from keras_vllm import envs
from keras_vllm import format as fmt


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
        SignatureError: the artifact is unsigned, signed by another key,
            changed after signing, or its signature leaves files out.
    """
    signed = signed_digests(directory, public_key)
    if signed is None:
        return None
    return os.path.join(os.path.abspath(directory), fmt.SIGNATURE_FILE)


def signed_digests(directory, public_key=None):
    """`require_signature`, returning `{file: sha256}` the signature vouches
    for (None without a policy), for a reader to check the bytes it reads."""
    key, source = public_key_for(public_key)
    if key is None:
        return None
    from keras_vllm.signing.verify import verify_signed

    return verify_signed(directory, key, required_by=source)[1]
