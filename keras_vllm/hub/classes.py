"""The allowlist of classes an artifact may name.

An artifact names its backbone, tokenizer, preprocessor, causal LM and
sampler classes by Keras registered name. Loading resolves only names that
keras-hub itself registered (`keras_hub>...`) and whose class derives from
the expected KerasHub base class, so an artifact can never make the loader
import or run other code.
"""

from keras_vllm.errors import ArtifactError
from keras_vllm.errors import UnsupportedModelError

_PREFIX = "keras_hub>"


def _bases():
    import keras_hub

    return {
        "backbone": keras_hub.models.Backbone,
        "causal_lm": keras_hub.models.CausalLM,
        "tokenizer": keras_hub.tokenizers.Tokenizer,
        "preprocessor": keras_hub.models.Preprocessor,
        "sampler": keras_hub.samplers.Sampler,
    }


def registered_name(obj):
    """The Keras registered name of an object's class."""
    import keras

    return keras.saving.get_registered_name(type(obj))


def check_exportable(obj, role):
    """Raises `UnsupportedModelError` unless `obj` is an allowed class."""
    name = registered_name(obj)
    base = _bases()[role]
    if not (name.startswith(_PREFIX) and isinstance(obj, base)):
        raise UnsupportedModelError(
            f"The {role} is a {type(obj).__module__}.{type(obj).__name__}, "
            f"not a class registered by keras-hub (subclass of "
            f"keras_hub.{base.__module__.split('.')[-2]}.{base.__name__}). "
            "keras-vllm exports KerasHub models only, so that an artifact "
            "never needs custom code to load."
        )
    return name


def resolve(name, role):
    """Resolves a registered name from an artifact to an allowed class.

    Raises:
        ArtifactError: if the name is not a keras-hub class of that role.
    """
    import keras

    base = _bases()[role]
    cls = None
    if isinstance(name, str) and name.startswith(_PREFIX):
        cls = keras.saving.get_registered_object(name)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ArtifactError(
            f"The artifact's {role} class '{name}' is not on the allowlist "
            f"(keras-hub registered subclasses of {base.__name__}). The "
            "artifact was written by another tool or altered; re-export it."
        )
    if not cls.__module__.startswith("keras_hub."):
        raise ArtifactError(
            f"The artifact's {role} class '{name}' resolves outside keras-hub."
        )
    return cls
