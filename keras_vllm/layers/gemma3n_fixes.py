"""The fixes keras-hub 0.32's Gemma 3n needs under keras-vllm.

- `Gemma3nCausalLM` computes its logits in its functional graph as
  `backbone.language_model.token_embedding(hidden, reverse=True)`, a method
  that multiplies by the embedding variable while the graph is built: the
  table's value at construction becomes a constant of the graph. After
  fine-tuning (or any weight change) `causal_lm(x)` and `fit()` use the
  stale table while `generate()` (which calls the method again) uses the
  current one; the tied head is never trained. The replacement
  `token_embedding` records a `Gemma3nOutputHead` layer call for a symbolic
  input instead, so every call reads the current table; called on arrays
  it is the original method.
- `Gemma3nBackbone` lacks what keras-vllm reads of every text backbone:
  `hidden_dim`, `vocabulary_size` and a reversible `token_embedding`. They
  are added as properties over its text model (`text_hidden_size`,
  `text_vocab_size`, `Gemma3nTokenEmbedding`).
- `Gemma3nTextModel` keeps its decoder blocks and AltUp projections in
  list attributes, which Keras turns into its `TrackedList`; flax NNX
  (`KERAS_NNX_ENABLED=true`) does not traverse that type, so a model split
  and merged by NNX (tpu-inference's jitted step) still calls the original
  layers and reads their weights as constants baked into the compiled
  program (measured: 128 of the tiny model's 155 weights): weight updates
  and per-token LoRA slots never reach the step, and every weight is
  stored again in the program. The replacement constructor rebinds those
  attributes as plain lists, which NNX traverses and Keras saves the same
  way (the weight files' layout is unchanged).
- `Gemma3nBackbone.enable_lora(rank)` LoRA-fies the layers named by
  `default_lora_layer_names()`, Keras' `query_dense` / `value_dense` /
  `query` / `value`; Gemma 3n's projections are `q_proj` / `v_proj`, so it
  freezes the model and adapts nothing. The replacement names them.

Installed (through `keras_vllm.patching`) as soon as keras-hub imports
`gemma3n_backbone` (`keras_vllm.export.keras_hub_hooks`), so a Gemma 3n
model built after `import keras_vllm` trains, generates and exports with
one output head. Weights and presets are unchanged (the head layer owns no
variable).
"""

import functools
import inspect

from keras_vllm import patching

# The keras-hub module whose classes these fixes apply to.
KERAS_HUB_MODULE = "keras_hub.src.models.gemma3n.gemma3n_backbone"

# Gemma 3n's query and value projections (`Gemma3nTextAttention`).
LORA_LAYER_NAMES = ("q_proj", "v_proj")


def _live_output_head(original):
    import keras

    @functools.wraps(original)
    def token_embedding(self, inputs, reverse=False):
        if reverse and isinstance(inputs, keras.KerasTensor):
            from keras_vllm.layers.gemma3n_head import Gemma3nOutputHead

            head = Gemma3nOutputHead(self, name=f"{self.name}_output_head")
            return head(inputs)
        return original(self, inputs, reverse=reverse)

    return token_embedding


class _Property(property):
    """A property `keras_vllm.patching` can mark (a plain `property` takes
    no attributes)."""


def _hidden_dim(backbone):
    return int(backbone.text_hidden_size)


def _vocabulary_size(backbone):
    return int(backbone.text_vocab_size)


def _token_embedding(backbone):
    from keras_vllm.layers.gemma3n_head import Gemma3nTokenEmbedding

    return Gemma3nTokenEmbedding(backbone.language_model)


def _lora_layer_names(original):
    def default_lora_layer_names(self):
        return list(LORA_LAYER_NAMES)

    return default_lora_layer_names


# `Gemma3nTextModel`'s list attributes of layers (see the docstring).
LAYER_LISTS = (
    "transformer_layers", "altup_projections", "altup_unembed_projections",
)


def _lists_nnx_traverses(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for name in LAYER_LISTS:
            # Past Keras' `__setattr__`, which would wrap the list again.
            object.__setattr__(self, name, list(getattr(self, name)))

    # Keras reads a layer's constructor arguments from this signature.
    __init__.__signature__ = inspect.signature(original)
    return __init__


def install(module):
    """Fixes the Gemma 3n classes of keras-hub's `module` (once).

    Args:
        module: the imported `keras_hub.src.models.gemma3n.gemma3n_backbone`.
    """
    backbone = module.Gemma3nBackbone
    text_model = module.Gemma3nTextModel
    patching.replace(text_model, "token_embedding", _live_output_head)
    patching.replace(text_model, "__init__", _lists_nnx_traverses)
    patching.add(backbone, "hidden_dim", _Property(_hidden_dim))
    patching.add(backbone, "vocabulary_size", _Property(_vocabulary_size))
    patching.replace(
        backbone, "token_embedding", lambda _: _Property(_token_embedding)
    )
    patching.replace(backbone, "default_lora_layer_names", _lora_layer_names)
