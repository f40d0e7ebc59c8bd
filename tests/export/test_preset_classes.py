"""`CausalLM.from_preset` builds a Gemma 4 checkpoint's model, not its drafter
(`keras_vllm/export/preset_classes.py`; issue #61, item 4).

keras-hub registers two `CausalLM` classes for `Gemma4Backbone`, the drafter
`Gemma4AssistantCausalLM` first, and lists them in an order that changes
from process to process. Each check runs in a fresh interpreter that
imports torch first (where installed, as the report did), then keras_vllm:
the registry keeps keras-hub's own order (the same as with keras-hub alone),
subclasses are listed in that order, and a tiny Keras preset, a tiny
Hugging Face checkpoint and a drafter's preset each load as their class.

Cost: ~55 s (three tiny models written, two interpreters importing
torch and keras-hub, three loads).
"""

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from keras_vllm import testing

SCRIPT = textwrap.dedent(
    """
    import importlib.util
    import inspect
    import json
    import sys

    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (before keras_vllm, as in the report)
    if sys.argv[1] == "keras_vllm":
        import keras_vllm  # noqa: F401
    import keras
    import keras_hub
    from keras_hub.src.models.gemma4.gemma4_backbone import Gemma4Backbone
    from keras_hub.src.utils import preset_utils

    base = keras_hub.models.CausalLM
    registered = [
        x for x in dict.fromkeys(keras.saving.get_custom_objects().values())
        if inspect.isclass(x) and x is not base and issubclass(x, base)
    ]
    listed = preset_utils.list_subclasses(base)


    def load(preset):
        # An error is an outcome to compare: the other checks still run.
        try:
            return type(base.from_preset(preset)).__name__
        except Exception as e:
            return f"{type(e).__name__}: {e}"


    def names(classes, backbone_cls=None):
        return [
            x.__name__ for x in classes
            if backbone_cls is None or x.backbone_cls is backbone_cls
        ]


    result = {
        "registered": names(registered),
        "registered_gemma4": names(registered, Gemma4Backbone),
        "listed": names(listed),
        "listed_gemma4": names(listed, Gemma4Backbone),
        "loaded": {preset: load(preset) for preset in sys.argv[2:]},
    }
    print("RESULT " + json.dumps(result))
    """
)


def _run(*args):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """`{preset directory: the class it must load as}`."""
    root = tmp_path_factory.mktemp("presets")
    target = testing.build_tiny_causal_lm("gemma4_e2b")
    expected = {
        testing.save_tiny_preset(
            testing.build_tiny_causal_lm("gemma4"), root / "keras"
        ): "Gemma4CausalLM",
        testing.save_tiny_preset(
            testing.build_tiny_assistant(target), root / "assistant"
        ): "Gemma4AssistantCausalLM",
    }
    if importlib.util.find_spec("transformers") is not None:
        from helpers import hf_checkpoints

        hf = str(root / "hf")
        hf_checkpoints.write_checkpoint("gemma4", hf)
        expected[hf] = "Gemma4CausalLM"
    return expected


def test_keras_vllm_keeps_the_registry_and_picks_the_model(presets):
    alone = _run("keras_hub")
    with_keras_vllm = _run("keras_vllm", *presets)
    # Importing keras_vllm registers nothing early: keras-hub's order.
    assert with_keras_vllm["registered"] == alone["registered"]
    assert with_keras_vllm["registered_gemma4"] == alone["registered_gemma4"]
    assert set(alone["registered_gemma4"]) == {
        "Gemma4CausalLM", "Gemma4AssistantCausalLM"
    }
    # Listed in that order, not in the order of the classes' addresses.
    assert with_keras_vllm["listed"] == alone["registered"]
    assert with_keras_vllm["listed_gemma4"] == alone["registered_gemma4"]
    assert with_keras_vllm["loaded"] == presets
