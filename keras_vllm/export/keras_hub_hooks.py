"""What `import keras_vllm` adds to keras-hub.

- `keras_hub.models.CausalLM.export_vllm(path, ...)`, so every family has
  the export method;
- a record of the preset each model was loaded from, so an export can
  reference it without the user repeating the handle;
- a fixed choice of the class `CausalLM.from_preset` builds where several
  share a backbone (`keras_vllm.export.preset_classes`: keras-hub's
  choice varies from process to process);
- the fixes of keras-hub layers listed in
  `keras_vllm.layers.keras_hub_fixes.FIXES`, each installed when keras-hub
  imports the module that defines the layers (before any model is built).

keras-hub is not imported just for this (importing it pulls in TensorFlow
and, where installed, vLLM and torch: seconds that `keras-vllm inspect` and
vLLM's front-end process should not pay). If keras-hub is already imported
the hooks are installed at once, otherwise right after its import.
"""

import functools
import importlib.abc
import importlib.util
import sys

from keras_vllm import patching
from keras_vllm.export import preset_classes
from keras_vllm.layers.keras_hub_fixes import FIXES

_INSTALLED = False
_TARGET = "keras_hub.src.models.causal_lm"


def _export_vllm(self, path, **kwargs):
    from keras_vllm.export import export_vllm

    return export_vllm(self, path, **kwargs)


def _record_preset(from_preset):
    @functools.wraps(from_preset.__func__)
    def wrapper(cls, preset, *args, **kwargs):
        model = from_preset.__func__(cls, preset, *args, **kwargs)
        for obj in (model, getattr(model, "backbone", None)):
            if obj is not None:
                try:
                    obj._keras_vllm_preset = str(preset)
                except (AttributeError, TypeError):
                    pass
        return model

    return classmethod(wrapper)


def _install_now():
    global _INSTALLED
    if _INSTALLED:
        return
    # The defining modules, not `keras_hub.models`: vLLM's plugin loader
    # can import keras_vllm while `keras_hub` itself is still initializing
    # (keras-hub imports vLLM), when `keras_hub.models` does not exist yet.
    from keras_hub.src.models.backbone import Backbone
    from keras_hub.src.models.causal_lm import CausalLM
    from keras_hub.src.models.task import Task

    from keras_vllm.export.exporter import export_vllm

    _INSTALLED = True
    _export_vllm.__doc__ = export_vllm.__doc__
    patching.add(CausalLM, "export_vllm", _export_vllm)
    for base in (Task, Backbone):
        patching.replace(base, "from_preset", _record_preset)


def _hooks():
    """`{module name: function of the module}` to run once it is loaded."""
    return {
        _TARGET: lambda module: _install_now(),
        preset_classes.KERAS_HUB_MODULE: preset_classes.install,
        **FIXES,
    }


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs each hook once the keras-hub module it names has loaded."""

    def __init__(self, hooks):
        self.hooks = dict(hooks)

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        if not self.hooks:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        patching.replace(spec.loader, "exec_module", _then(hook))
        return spec


def _then(hook):

    def make(exec_module):

        def exec_and_install(module):
            exec_module(module)
            hook(module)

        return exec_and_install

    return make


def install():
    """Adds keras-vllm's hooks to keras-hub (idempotent)."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    later = {}
    for name, hook in _hooks().items():
        if name in sys.modules:
            hook(sys.modules[name])
        else:
            later[name] = hook
    if later:
        sys.meta_path.insert(0, _AfterImport(later))
