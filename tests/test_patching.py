"""`keras_vllm.patching`: the one way upstream functions are replaced."""

import sys
import types

import pytest

from keras_vllm import patching
from keras_vllm.errors import ServingError


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def test_replace_once_marks_and_lists_the_replacement():
    home = _module("fakeupstream_a", greet=lambda who: f"hello {who}")
    calls = []

    def louder(original):
        calls.append(original)
        return lambda who: original(who).upper()

    first = patching.replace(home, "greet", louder)
    again = patching.replace(home, "greet", louder)
    assert first is again and len(calls) == 1
    assert home.greet("you") == "HELLO YOU"
    assert patching.original_of(home.greet)("you") == "hello you"
    assert patching.replacements()["fakeupstream_a.greet"] is first


def test_a_replacement_on_one_object_does_not_keep_it_alive():
    # An engine's runner patched per instance: the record of the patch
    # must not hold the runner (and its KV cache) after the engine is gone.
    import gc
    import weakref

    class Runner:
        def step(self):
            return "compiled"

    runner = Runner()
    patching.replace(runner, "step", lambda original: lambda: "skipped")
    assert runner.step() == "skipped"
    assert any(k.endswith(".Runner().step") for k in patching.replacements())
    gone = weakref.ref(runner)
    del runner
    gc.collect()
    assert gone() is None


def test_everywhere_rebinds_copies_bound_by_name():
    def size():
        return 1

    home = _module("fakeupstream_b.utils", size=size)
    user = _module("fakeupstream_b.runner", size=size)  # `from utils import size`
    other = _module("elsewhere_b", size=size)
    patching.replace(home, "size", lambda original: lambda: 2,
                     everywhere="fakeupstream_b")
    assert home.size() == user.size() == 2
    assert other.size() == 1  # outside the prefix: left alone


def test_a_classmethod_stays_a_classmethod():
    class Platform:
        @classmethod
        def name(cls):
            return cls.__name__

    def suffixed(original):
        return classmethod(lambda cls: original.__func__(cls) + "!")

    patching.replace(Platform, "name", suffixed)
    patching.replace(Platform, "name", suffixed)
    assert Platform.name() == "Platform!"
    assert patching.is_replacement(vars(Platform)["name"])


def test_add_refuses_to_shadow_an_upstream_attribute():
    class Model:
        def export(self):
            return "upstream"

    def ours(self):
        return "ours"

    patching.add(Model, "export_ours", ours)
    patching.add(Model, "export_ours", ours)
    assert Model().export_ours() == "ours"
    with pytest.raises(ServingError, match="already has 'export'"):
        patching.add(Model, "export", ours)


def test_check_versions_names_both_versions(monkeypatch):
    monkeypatch.setattr(
        patching, "installed_version",
        lambda package: {"vllm-tpu": "0.33.1"}.get(package, "0.32.0"),
    )
    with pytest.raises(ServingError) as error:
        patching.check_versions()
    message = str(error.value)
    assert "vllm-tpu==0.32.0" in message and "0.33.1 is installed" in message
    assert 'pip install "keras-vllm[serving]"' in message

    monkeypatch.setattr(patching, "installed_version", lambda package: None)
    with pytest.raises(ServingError, match="it is not installed"):
        patching.check_versions()


def test_a_second_fix_of_the_same_function_applies_too():
    # Two fixes of one function (the speculation hook and the prompt-length
    # hook both wrap the runner's `_prepare_inputs`): both run, the latest
    # outermost, and neither is applied twice when its module runs again.
    home = _module("fakeupstream_c", greet=lambda who: f"hello {who}")
    upstream = home.greet

    def shouting(original):
        return lambda who: original(who).upper()

    def polite(original):
        return lambda who: original(who) + ", please"

    patching.replace(home, "greet", shouting)
    patching.replace(home, "greet", polite)
    patching.replace(home, "greet", shouting)
    patching.replace(home, "greet", polite)
    assert home.greet("you") == "HELLO YOU, please"
    assert patching.upstream_of(home.greet) is upstream
    assert patching.original_of(patching.original_of(home.greet)) is upstream
    assert patching.upstream_of(upstream) is upstream


def test_closures_of_one_fix_are_one_fix():
    # A module that builds its `make` inside a function makes a new closure
    # each time it runs; it is still the same fix.
    home = _module("fakeupstream_d", size=lambda: 1)

    def install(step):
        def adding(original):
            return lambda: original() + step

        patching.replace(home, "size", adding)

    install(1)
    install(1)
    assert home.size() == 2
