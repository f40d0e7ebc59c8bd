"""Which class keras-hub builds for `CausalLM.from_preset(preset)`.

When `from_preset` is called on a base class (`keras_hub.models.CausalLM`),
keras-hub 0.32 picks the registered subclass whose `backbone_cls` is the
preset's (`keras_hub.src.utils.preset_utils.find_subclass`), meaning to
take "the subclass that was registered first". Two gaps:

- `list_subclasses` deduplicates the registry through a `set`, so the
  classes come in the order of their ids' hashes, i.e. of their memory
  addresses: the order changes from one process to the next (address
  randomization) and with whatever was imported before (`import torch`,
  `import keras_vllm`), with keras-hub alone too.
- Several classes share one backbone: `Gemma4CausalLM` and its
  speculative-decoding drafter `Gemma4AssistantCausalLM`, which keras-hub
  registers first (its public API imports modules alphabetically). So
  `CausalLM.from_preset(<Gemma 4 checkpoint>)` builds the drafter about
  one process in two and fails with `TypeError: Gemma4AssistantCausalLM.
  __init__() missing 4 required positional arguments`; taking the first
  registered class would fail every time.

The replacements (through `keras_vllm.patching`, installed when keras-hub
imports `preset_utils`, `keras_vllm.export.keras_hub_hooks`):

- `list_subclasses` returns the classes in registration order, so the
  choice is the same in every process;
- `find_subclass`, when several classes share the backbone, takes the one
  the preset names (a Keras preset's `task.json`; a Hugging Face
  checkpoint's architecture, by keras-hub's naming), else the
  first one that generates on its own (its constructor takes a
  `preprocessor`), else keras-hub's first. A backbone with one class, and
  a class asked for by name (`Gemma4AssistantCausalLM.from_preset(...)`),
  load exactly as before.

Importing this module imports neither keras nor keras-hub.
"""

import functools
import inspect

from keras_vllm import patching
from keras_vllm.export.capabilities import takes_preprocessor

# The keras-hub module these fixes apply to.
KERAS_HUB_MODULE = "keras_hub.src.utils.preset_utils"

def _in_registration_order(list_subclasses):

    @functools.wraps(list_subclasses)
    def list_subclasses_in_registration_order(cls):
        import keras

        # Every class is registered twice (`keras_hub>` and `keras_nlp>`
        # names); `dict.fromkeys` drops the repeat and keeps the order.
        registered = dict.fromkeys(keras.saving.get_custom_objects().values())
        return [
            x for x in registered
            if inspect.isclass(x) and x is not cls and issubclass(x, cls)
        ]

    return list_subclasses_in_registration_order


def _named_class(preset_utils, preset):
    """The class a Keras preset's `task.json` names, or None."""
    import keras

    path = preset_utils.TASK_CONFIG_FILE
    if not preset_utils.check_file_exists(preset, path):
        return None
    task = preset_utils.load_json(preset, path)
    name = task.get("registered_name")
    return keras.saving.get_registered_object(name) if name else None


def _architecture_class(config, candidates):
    """The candidate a Hugging Face checkpoint's architecture names, or
    None: keras-hub names its tasks as transformers does, less "For"
    (`XForCausalLM` is `XCausalLM`, a drafter's `XAssistantForCausalLM`
    is `XAssistantCausalLM`)."""
    architectures = config.get("architectures") or [""]
    name = str(architectures[0]).replace("For", "", 1)
    return next((c for c in candidates if c.__name__ == name), None)


def choose(preset_utils, preset, candidates):
    """The class to build among `candidates` (registration order).

    Args:
        preset_utils: keras-hub's `preset_utils` module.
        preset: the preset handle or directory being loaded.
        candidates: the registered subclasses sharing its backbone, more
            than one.

    Returns:
        The class the preset names (a Keras preset's `task.json`, a
        Hugging Face checkpoint's architecture), else the first that
        generates on its own, else the first.
    """
    config = preset_utils.load_json(preset, preset_utils.CONFIG_FILE)
    if "registered_name" in config:  # A Keras preset.
        named = _named_class(preset_utils, preset)
        if named in candidates:
            return named
        for cls in candidates:
            # `KerasPresetLoader.load_task` builds `task.json`'s class
            # from its config when it subclasses the chosen one.
            if named is not None and issubclass(named, cls):
                return cls
    named = _architecture_class(config, candidates)
    if named is not None:
        return named
    for cls in candidates:
        if takes_preprocessor(cls):
            return cls
    return candidates[0]


def _preset_aware(find_subclass):

    @functools.wraps(find_subclass)
    def find_subclass_for_preset(preset, cls, backbone_cls):
        from keras_hub.src.models.task import Task
        from keras_hub.src.utils import preset_utils

        candidates = [
            x for x in preset_utils.list_subclasses(cls)
            if x.backbone_cls == backbone_cls
        ]
        # One class, or none (keras-hub's error), or not a task (tokenizers,
        # preprocessors: nothing to read in the preset): keras-hub's choice,
        # in registration order now.
        if len(candidates) < 2 or not issubclass(cls, Task):
            return find_subclass(preset, cls, backbone_cls)
        # keras-hub's own narrowing to direct subclasses, kept as it is.
        directs = [x for x in candidates if x in cls.__bases__]
        if len(directs) > 1:
            candidates = directs
        return choose(preset_utils, preset, candidates)

    return find_subclass_for_preset


def install(preset_utils):
    """Fixes keras-hub's `preset_utils` module (idempotent)."""
    patching.replace(preset_utils, "list_subclasses", _in_registration_order)
    # `task.py` and the preprocessing layers import `find_subclass` by
    # name; those already loaded get the replacement too.
    patching.replace(
        preset_utils, "find_subclass", _preset_aware, everywhere="keras_hub"
    )
