"""keras-vllm's vLLM plugin loads beside keras-hub 0.32's own plugin."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tpu_inference")

SCRIPT = textwrap.dedent(
    """
    import importlib.metadata as md
    names = {e.name: e.value for e in md.entry_points(group="vllm.general_plugins")}
    assert names.get("keras_vllm") == "keras_vllm.serve.plugin:register", names
    assert "register_keras_hub" in names, names
    platforms = {e.name for e in md.entry_points(group="vllm.platform_plugins")}
    assert "keras_vllm_cpu" in platforms, platforms

    from vllm.plugins import load_general_plugins
    load_general_plugins()   # runs both plugins, as every vLLM process does

    import jax
    from jax._src import xla_bridge
    assert not xla_bridge._backends, "a plugin started JAX before vLLM forks"

    from tpu_inference.models.common.model_loader import _MODEL_REGISTRY
    from keras_vllm.serve.worker.model import KerasVllmForCausalLM
    from keras_hub.src.vllm.keras_hub_vllm_wrapper import KerasHubVllmModel
    assert _MODEL_REGISTRY["KerasVllmForCausalLM"] is KerasVllmForCausalLM
    assert _MODEL_REGISTRY["KerasHubForCausalLM"] is KerasHubVllmModel

    from vllm.model_executor.models.registry import ModelRegistry
    archs = ModelRegistry.get_supported_archs()
    assert "KerasVllmForCausalLM" in archs and "KerasHubForCausalLM" in archs

    from vllm.tokenizers.registry import TokenizerRegistry
    ours = TokenizerRegistry.load_tokenizer_cls("keras_vllm")
    theirs = TokenizerRegistry.load_tokenizer_cls("keras_hub")
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer
    assert ours is KerasVllmTokenizer, ours
    assert theirs.__module__.startswith("keras_hub."), theirs

    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    assert CONFIG_MAPPING["keras_vllm"].__module__ == "keras_vllm.serve.hf_config"
    assert CONFIG_MAPPING["keras_hub"].__module__.startswith("keras_hub.")
    print("PLUGINS OK")
    """
)


def test_both_plugins_register_their_own_names():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "PLUGINS OK" in result.stdout, result.stderr[-4000:]


DTYPE_SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys, tempfile
    import torch
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from transformers import AutoConfig
    from vllm.config import model as model_config

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("keras_vllm").addHandler(handler)
    logging.getLogger("keras_vllm").setLevel(logging.INFO)

    def resolve(directory, dtype):
        config = AutoConfig.from_pretrained(directory)
        return model_config._get_and_verify_dtype(
            directory, config, dtype, is_pooling_model=False
        )

    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({"model_type": "keras_vllm", "torch_dtype": "float32",
                   "architectures": ["KerasVllmForCausalLM"]}, f)
    assert resolve(directory, "auto") == torch.float32
    assert any("stored dtype float32" in r for r in records), records
    assert resolve(directory, "bfloat16") == torch.bfloat16
    assert any("may differ from CausalLM.generate()" in r for r in records)

    other = tempfile.mkdtemp()
    with open(os.path.join(other, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "torch_dtype": "float32"}, f)
    # Other models keep vLLM's own rule (float32 is downcast).
    assert resolve(other, "auto") != torch.float32
    print("DTYPE OK")
    """
)


def test_plain_vllm_serves_the_stored_dtype():
    result = subprocess.run(
        [sys.executable, "-c", DTYPE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "DTYPE OK" in result.stdout, result.stderr[-4000:]


def test_no_system_first_warning_for_an_artifact_without_template():
    # vLLM's API server probes the chat template at start-up and warns that
    # it "requires system-first ordering" when there is none.
    import types

    import vllm.entrypoints.launchers.api_server.entry  # noqa: F401
    from vllm.entrypoints.anthropic import serving

    from keras_vllm.serve import plugin
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    plugin._no_system_first_probe_without_template()
    tokenizer = object.__new__(KerasVllmTokenizer)
    tokenizer.chat_template = None
    renderer = types.SimpleNamespace(
        renderer=types.SimpleNamespace(tokenizer=tokenizer), chat_template=None
    )
    probe = serving.AnthropicServingMessages._should_merge_inline_system
    assert probe(renderer) is False
    # Anything else is probed as before (no template there: merge).
    other = types.SimpleNamespace(
        renderer=types.SimpleNamespace(tokenizer=None), chat_template=None
    )
    assert probe(other) is True
