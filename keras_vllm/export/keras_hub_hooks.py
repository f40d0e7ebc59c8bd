"""What `import keras_vllm` adds to keras-hub.

- `keras_hub.models.CausalLM.export_vllm(path, ...)`, so every family has
  the export method;
- a record of the preset each model was loaded from, so an export can
  reference it without the user repeating the handle.

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


class _AfterImport(importlib.abc.MetaPathFinder):
    """Installs the hooks once keras-hub's `CausalLM` module has loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        patching.replace(spec.loader, "exec_module", _then_install)
        return spec


def _then_install(exec_module):

    def exec_and_install(module):
        exec_module(module)
        _install_now()

    return exec_and_install


def install():
    """Adds keras-vllm's hooks to keras-hub (idempotent)."""
    if _INSTALLED:
        return
    if _TARGET in sys.modules:
        _install_now()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
