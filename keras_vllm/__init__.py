"""keras-vllm: export a fine-tuned KerasHub `CausalLM` and serve it on vLLM.

```python
import keras_vllm  # adds `CausalLM.export_vllm`

causal_lm.export_vllm("exports/my_model")                 # training side
causal_lm = keras_vllm.load_causal_lm("exports/my_model")  # Keras side
engine = keras_vllm.KerasVllmEngine.from_export("exports/my_model")  # vLLM
```
"""

from keras_vllm import _env  # noqa: F401  (must precede any keras import)
from keras_vllm.errors import AccessError
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ConfigurationError
from keras_vllm.errors import ExportError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import KerasVllmError
from keras_vllm.errors import PresetUnavailableError
from keras_vllm.errors import RequestError
from keras_vllm.errors import ServingError
from keras_vllm.errors import SignatureError
from keras_vllm.errors import UnsupportedModelError
from keras_vllm.errors import VersionSkewError
from keras_vllm.version import __version__
from keras_vllm.export import export_vllm
from keras_vllm.export.assistant import export_assistant
from keras_vllm.load.assistant import load_assistant
from keras_vllm.load import load_causal_lm
from keras_vllm.load import load_tokenizer
from keras_vllm import signing
from keras_vllm.signing import sign_artifact
from keras_vllm.signing import verify_signature
from keras_vllm.export import keras_hub_hooks

keras_hub_hooks.install()

__all__ = [
    "AccessError",
    "ArtifactError",
    "ConfigurationError",
    "ExportError",
    "IntegrityError",
    "KerasVllmEngine",
    "KerasVllmError",
    "PresetUnavailableError",
    "RequestError",
    "ServingError",
    "SignatureError",
    "UnsupportedModelError",
    "VersionSkewError",
    "__version__",
    "export_assistant",
    "export_vllm",
    "load_assistant",
    "load_causal_lm",
    "load_tokenizer",
    "sign_artifact",
    "signing",
    "verify_signature",
]


def __getattr__(name):
    # The engine imports vLLM; load it only when asked so that export-only
    # installs (no vLLM) work.
    if name == "KerasVllmEngine":
        from keras_vllm.serve.engine.engine import KerasVllmEngine

        return KerasVllmEngine
    raise AttributeError(f"module 'keras_vllm' has no attribute '{name}'")
