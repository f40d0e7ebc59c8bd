"""Process-wide settings every keras-vllm entry point needs.

Imported first by `keras_vllm/__init__.py`, before keras is imported: Keras
picks its backend and NNX mode once, at import time.
"""

import os


def configure_environment():
    """Sets the JAX backend and NNX mode unless the user chose otherwise."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("KERAS_NNX_ENABLED", "true")


configure_environment()
