"""The worker's LoRA manager on its own (no engine): a reload's new base
is checked against the adapters it holds, and `load_inplace` reads the new
path before anything held changes (issue 40)."""

import types

import pytest

from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import ServingError
from keras_vllm.serve.worker import lora_manager

from helpers import lora_exports
from helpers.trained_models import trained


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    found = lora_exports.exports(tmp_path_factory)
    other = trained("llama").export_vllm(
        tmp_path_factory.mktemp("other") / "base", **lora_exports.ONE_GOLDEN
    )
    return dict(found, other=str(other))


def _manager(base):
    model = types.SimpleNamespace(artifact=fmt.open_artifact(base, verify=False))
    config = types.SimpleNamespace(max_loras=1, max_lora_rank=8,
                                   max_cpu_loras=1)
    return lora_manager.KerasLoraManager(model, config)


def _request(name, path, lora_id=1, load_inplace=False):
    return types.SimpleNamespace(lora_name=name, lora_int_id=lora_id,
                                 lora_path=path, load_inplace=load_inplace)


def _hold(manager, request):
    # What `add_adapter` keeps once it read an adapter (values unused here).
    manager._adapters[request.lora_int_id] = lora_manager._Adapter(
        request, factors=[]
    )


def test_a_new_base_is_refused_while_adapters_of_the_old_are_held(exports):
    manager = _manager(exports["base"])
    _hold(manager, _request("support", str(exports["paths"]["support"])))
    other = exports["other"]
    with pytest.raises(ServingError, match=r"\['support'\].*Unload them"):
        manager.check_new_base(fmt.open_artifact(other))
    # The served base itself fits (a reload to the same export).
    manager.check_new_base(fmt.open_artifact(exports["base"]))
    manager.remove_all_adapters()
    manager.check_new_base(fmt.open_artifact(other))


def test_load_inplace_reads_the_path_before_anything_changes(
    exports, tmp_path
):
    manager = _manager(exports["base"])
    held = _request("support", str(exports["paths"]["support"]))
    _hold(manager, held)
    assert manager.add_adapter(held) is False  # held: not read again
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (str(empty), exports["base"]):
        with pytest.raises((ArtifactError, ServingError)):
            manager.add_adapter(_request("support", path, load_inplace=True))
        assert manager._adapters[1].request is held
