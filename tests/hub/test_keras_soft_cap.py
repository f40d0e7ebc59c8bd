"""Keras' JAX attention without Splash ignores the logit soft cap.

KerasHub's Gemma attention passes its soft cap to
`keras.ops.dot_product_attention` on a TPU, and Keras 3.15.1 applies it only
inside the Splash kernel: its fallback (`jax.nn.dot_product_attention`, for
the shapes Splash refuses) drops it. The TPU tier's Keras reference works
around that (`tests/tpu/conftest.py::keras_reference_keeps_the_soft_cap`);
this test fails once Keras applies the cap, to say the workaround can go.
Checked through the backend function, which runs on a CPU. Cost: ~1 s.
"""

import numpy as np


def test_the_fallback_attention_ignores_the_soft_cap():
    from keras.src.backend.jax import nn as jax_nn

    rng = np.random.default_rng(0)
    q, k = (4 * rng.normal(size=(1, 8, 4, 16)).astype("float32") for _ in "qk")
    v = rng.normal(size=(1, 8, 4, 16)).astype("float32")

    def attend(**kwargs):
        return np.asarray(
            jax_nn.dot_product_attention(
                q, k, v, scale=0.25, flash_attention=False, **kwargs
            )
        )

    # What a cap of 1 computes: scale, then `cap * tanh(logits / cap)`.
    logits = np.tanh(0.25 * np.einsum("btnh,bsnh->bnts", q, k))
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    capped = np.einsum("bnts,bsnh->btnh", weights, v)

    uncapped = attend()
    got = attend(attn_logits_soft_cap=1.0)
    np.testing.assert_array_equal(got, uncapped)
    assert np.abs(got - capped).max() > 0.5
