"""The fix keras-hub 0.32's Mistral Hugging Face converter needs.

keras-hub converts a transformers Mistral checkpoint on load
(`keras_hub/src/utils/transformers/convert_mistral.py`), and its
`convert_weights` rounds every tensor through float16 on the way
(`hf_tensor.astype(np.float16)` in each weight's hook) before assigning it
to the (float32) Keras variable. A float32 checkpoint (what transformers
writes for a fine-tune by default) loses 13 mantissa bits per weight, and
bfloat16 weights below float16's normal range (6.1e-5) lose bits too:
measured on a tiny float32 checkpoint, logprobs 1.6e-4 from transformers'
at every position (5e-7 with the fix). No other keras-hub converter does
this.

The replacement `convert_weights` runs keras-hub's own, with each hook
given the checkpoint's tensor in a form whose float16 conversion keeps its
values: the hooks still transpose and reshape, the variable gets the
checkpoint's values in its own dtype. Installed (through
`keras_vllm.patching`) as soon as keras-hub imports `convert_mistral`
(`keras_vllm.export.keras_hub_hooks`).
"""

import functools

import numpy as np

from keras_vllm import patching

# The keras-hub module this fix applies to.
KERAS_HUB_MODULE = "keras_hub.src.utils.transformers.convert_mistral"


class _Unrounded(np.ndarray):
    """An array whose `astype(float16)` is itself (any other dtype converts
    as usual): keras-hub's hooks round through float16 by that call."""

    def astype(self, dtype, *args, **kwargs):
        if np.dtype(dtype) == np.float16:
            return self
        return super().astype(dtype, *args, **kwargs)


class _UnroundedLoader:
    """keras-hub's `SafetensorLoader` with each `port_weight` hook given
    an `_Unrounded` view of the checkpoint's tensor."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def port_weight(self, keras_variable, hf_weight_key, hook_fn=None):
        if hook_fn is not None:
            hook = hook_fn

            def hook_fn(tensor, keras_shape):
                return np.asarray(
                    hook(np.asarray(tensor).view(_Unrounded), keras_shape)
                )

        return self._loader.port_weight(keras_variable, hf_weight_key, hook_fn)


def _unrounded(original):

    @functools.wraps(original)
    def convert_weights(backbone, loader, transformers_config):
        return original(backbone, _UnroundedLoader(loader), transformers_config)

    return convert_weights


def install(module):
    """Fixes keras-hub's Mistral converter `module` (once).

    Args:
        module: the imported
            `keras_hub.src.utils.transformers.convert_mistral`.
    """
    patching.replace(module, "convert_weights", _unrounded)
