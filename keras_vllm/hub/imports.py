"""keras-hub imported without TensorFlow; vLLM kept out of non-serving runs.

keras-hub requires tensorflow-text, so TensorFlow is installed wherever
keras-hub is, and keras-hub imports it at its own import whenever it can:
~4-5 s and a few hundred MB in every process that imports keras-hub, and
that is each serving process (the front end, vLLM's engine process, the
engine fork server) before the first token. Serving never runs TensorFlow:
since keras-hub 0.32 its tokenizers and packers run in plain Python when
called eagerly, with or without TensorFlow (TensorFlow is only needed
inside `tf.data` or a `tf.function`, which serving does not use).

So a serving entry point imports keras-hub through `import_keras_hub()`:
when neither keras-hub nor TensorFlow is imported yet, keras-hub is
imported while `tensorflow` and `tensorflow_text` look absent, as if they
were not installed. Afterwards they can be imported again as usual, but
keras-hub keeps its TensorFlow-free code paths in this process; a process
that later wants keras-hub preprocessing inside `tf.data` sets
`KERAS_VLLM_SERVING_TENSORFLOW=1` (or imports keras-hub first). A
process that imported keras-hub already (a script that fine-tunes, then
serves) is left as it is.

Example:

```python
from keras_vllm.hub import imports

keras_hub = imports.import_keras_hub()
```
"""

import sys

from keras_vllm import envs

# The modules keras-hub imports only when it can; both look absent to it.
_TENSORFLOW = ("tensorflow", "tensorflow_text")


def import_keras_hub():
    """Imports keras-hub, without TensorFlow where nothing imported it yet.

    Returns:
        The `keras_hub` module.
    """
    if _keep_as_is():
        import keras_hub

        return keras_hub
    # A `None` entry in `sys.modules` makes `import name` raise ImportError,
    # which is how keras-hub's guarded imports detect an absent package.
    for name in _TENSORFLOW:
        sys.modules[name] = None
    try:
        import keras_hub
    finally:
        for name in _TENSORFLOW:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return keras_hub


def imported_without_tensorflow():
    """Whether keras-hub runs without TensorFlow in this process."""
    utils = sys.modules.get("keras_hub.src.utils.tensor_utils")
    return utils is not None and getattr(utils, "tf", None) is None


def _keep_as_is():
    if "keras_hub" in sys.modules or envs.SERVING_TENSORFLOW.get():
        return True
    # TensorFlow already imported (by the user's code): nothing to save.
    return any(sys.modules.get(name) is not None for name in _TENSORFLOW)


def without_serving_stack():
    """Keeps vLLM and tpu-inference out of this process (a command that
    never serves: `keras-vllm export`, `inspect`, `verify` without
    `--engine`).

    keras-hub 0.32 imports vLLM at `import keras_hub` wherever vLLM is
    installed (for its own `keras_hub.vllm.KerasHubLLM`), and vLLM loads
    tpu-inference through its plugins: about 20 s of a 28 s import on a
    2-core host, for nothing in these commands. They then run as they do
    in an export-only install (no vLLM), which they must support anyway;
    keras-hub defines its stub serving class, which is not used here.
    Does nothing once vLLM is imported.
    """
    for name in ("vllm", "tpu_inference"):
        # A None entry makes `import name` raise ImportError (Python's
        # documented way to block an import), which keras-hub's optional
        # import expects.
        sys.modules.setdefault(name, None)

