"""Which serialized Keras objects a manifest's configs may nest
(`format/configs.py::check_config_values`): dtype policies and keras-hub's
own classes, registered (`keras_hub>Name`) or, as Qwen 3.5's
`Qwen3_5VisionEncoder`, never registered by keras-hub (bare name, resolved
by Keras from its keras-hub module); nothing else."""

import pytest

from keras_vllm.errors import ArtifactError
from keras_vllm.format.configs import check_config_values

QWEN_MODULE = "keras_hub.src.models.qwen3_5.qwen3_5_vision_encoder"


def _nested(module, class_name, registered_name):
    return {
        "vision_encoder": {
            "module": module,
            "class_name": class_name,
            "registered_name": registered_name,
            "config": {"depth": 1},
        }
    }


@pytest.mark.parametrize(
    "module, class_name, registered_name",
    [
        (QWEN_MODULE, "Qwen3_5VisionEncoder", "Qwen3_5VisionEncoder"),
        (
            "keras_hub.src.models.gemma3.gemma3_vision_encoder",
            "Gemma3VisionEncoder",
            "keras_hub>Gemma3VisionEncoder",
        ),
    ],
)
def test_keras_hub_classes_are_allowed(module, class_name, registered_name):
    check_config_values(_nested(module, class_name, registered_name), "c")


@pytest.mark.parametrize(
    "module, class_name, registered_name",
    [
        # A bare name outside keras-hub (Keras would import that module).
        ("keras.layers", "Lambda", "Lambda"),
        ("os", "system", "system"),
        ("keras_hub_evil.models", "Encoder", "Encoder"),
        # A bare name that is not the class Keras would import.
        (QWEN_MODULE, "Qwen3_5VisionEncoder", "Other"),
        (QWEN_MODULE, "Qwen3_5VisionEncoder", "__import__('os')"),
        (QWEN_MODULE, "Qwen3_5VisionEncoder", None),
    ],
)
def test_other_nested_objects_are_refused(module, class_name, registered_name):
    with pytest.raises(ArtifactError, match="not on the allowlist"):
        check_config_values(_nested(module, class_name, registered_name), "c")
