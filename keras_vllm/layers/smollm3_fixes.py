"""The fixes keras-hub 0.32's SmolLM3 layers need under keras-vllm.

keras-vllm runs Keras with NNX (`KERAS_NNX_ENABLED=true`), and its format
stores each variable under its Keras path. keras-hub's SmolLM3 breaks both:

- `SmolLM3Attention.call` records `self.training = training`. Under NNX a
  layer may not set attributes while JAX traces it, so `fit()` and
  `generate()` of every SmolLM3 model fail with flax's
  `TraceContextError`. The replacement `__setattr__` stores that one
  attribute as Keras stores its own bookkeeping (`built`, `_called`) under
  NNX: as a plain attribute, outside NNX's checks. Nothing reads it.
- `SmolLM3Attention.build` leaves its rotary layer unbuilt, so Keras
  builds it on its first call. For a model that was never called eagerly
  (a preset, a reloaded export) that call is inside `generate()`'s or
  `fit()`'s trace, and building sets attributes: the same
  `TraceContextError`. The replacement `build` builds it with the rest of
  the layer (it has nothing to create: `inv_freq` is made in the
  constructor).
- `SmolLM3Attention.__init__` builds its output projection and its rotary
  layer's `inv_freq` at once, before any parent layer has opened its name
  scope, so those variables of every layer share the paths `o_proj/kernel`
  and `rotary_emb/inv_freq`. The replacement constructors of the decoder
  layer and the attention run inside their own name scope, so those
  variables get the paths they would have had if built later, like every
  other weight of the layer: `transformer_layer_3/self_attn/o_proj/kernel`.

Both are installed (through `keras_vllm.patching`) as soon as keras-hub's
`smollm3_layers` module is imported (`keras_vllm.export.keras_hub_hooks`),
so a SmolLM3 model built after `import keras_vllm` works unchanged:
exported, reloaded, fine-tuned and generating. Weights saved by keras-hub
(`.weights.h5`, presets, Hugging Face conversion) do not depend on these
paths and load as before.
"""

import functools
import inspect

from keras_vllm import patching

# The keras-hub module whose classes these fixes apply to.
KERAS_HUB_MODULE = "keras_hub.src.models.smollm3.smollm3_layers"

# Attributes `SmolLM3Attention.call` sets on the layer while traced.
_SET_IN_CALL = ("training",)


def _outside_nnx_checks(original):
    def __setattr__(self, name, value):
        if name in _SET_IN_CALL:
            object.__setattr__(self, name, value)
        else:
            original(self, name, value)

    return __setattr__


def _in_own_name_scope(original):
    from keras import name_scope
    from keras.src.utils.naming import auto_name

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        # Keras names an unnamed layer in `Layer.__init__`; naming it first
        # (the same way) lets the scope match the name it gets.
        if kwargs.get("name") is None:
            kwargs["name"] = auto_name(type(self).__name__)
        with name_scope(kwargs["name"]):
            original(self, *args, **kwargs)

    # Keras reads a layer's constructor arguments (its auto config) from
    # this signature, with and without following `__wrapped__`.
    __init__.__signature__ = inspect.signature(original)
    return __init__


def _with_rotary_built(original):

    @functools.wraps(original)
    def build(self, input_shape):
        original(self, input_shape)
        rotary = self.rotary_embedding
        if not rotary.built:
            hidden_shape = tuple(input_shape[0])
            rotary.build(
                hidden_shape[:-1] + (self.num_attention_heads, self.head_dim)
            )

    return build


def install(module):
    """Fixes the SmolLM3 layer classes of keras-hub's `module` (once).

    Args:
        module: the imported `keras_hub.src.models.smollm3.smollm3_layers`.
    """
    attention = module.SmolLM3Attention
    patching.replace(attention, "__setattr__", _outside_nnx_checks)
    patching.replace(attention, "__init__", _in_own_name_scope)
    patching.replace(attention, "build", _with_rotary_built)
    patching.replace(module.SmolLM3DecoderLayer, "__init__", _in_own_name_scope)
