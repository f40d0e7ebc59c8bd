"""The fix keras-hub 0.32's Llama backbone needs.

`LlamaBackbone` (and `Llama3Backbone`, its subclass) takes
`tie_word_embeddings` but its `get_config()` leaves it out, so a config
rebuilds an untied backbone whatever the model was. Llama 3.2's 1B and 3B
checkpoints tie their embeddings (keras-hub's Hugging Face converter builds
them tied), so such a model, fine-tuned and saved, came back with one more
variable than it has: `save_to_preset` then `from_preset` fails to load its
weights, and an artifact failed at load ("The artifact stores variable
'sequence_output_layernorm/scale' at position 19, where the rebuilt
backbone has ..."). Found preparing the seed table's Llama 3.2 1B-shaped
benchmark model.

The replacement `get_config` adds the argument where it is true, so the
config describes the model (for keras-vllm's artifact, and for keras-hub's
own presets saved after `import keras_vllm`); an untied model's config is
what it was (the constructor's default), so artifacts and presets saved
before compare equal to those saved now. Installed (through
`keras_vllm.patching`) as soon as keras-hub imports `llama_backbone`
(`keras_vllm.export.keras_hub_hooks`).
"""

import functools

from keras_vllm import patching

# The keras-hub module whose class this fix applies to.
KERAS_HUB_MODULE = "keras_hub.src.models.llama.llama_backbone"


def _with_tied_embeddings(original):

    @functools.wraps(original)
    def get_config(self):
        config = original(self)
        if self.tie_word_embeddings:
            config["tie_word_embeddings"] = True
        return config

    return get_config


def install(module):
    """Fixes keras-hub's `LlamaBackbone` of `module` (once).

    Args:
        module: the imported `keras_hub.src.models.llama.llama_backbone`.
    """
    patching.replace(module.LlamaBackbone, "get_config", _with_tied_embeddings)
