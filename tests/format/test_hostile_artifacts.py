"""Every hostile artifact of `hostile_corpus` is refused, by both loaders.

`keras_vllm.load_causal_lm` and `KerasVllmEngine.from_export` must raise the
package's own exception type with a clear message, without crashing inside
JAX or orbax and without hanging (each case runs under `signal.alarm`).
The engine path must refuse before vLLM starts: `vllm.LLM` is replaced by a
stub that fails the test if it is ever reached.
"""

import re
import signal
import sys
import types

import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing

from helpers import hostile_corpus

CASE_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def good_artifact(tmp_path_factory):
    causal_lm = testing.build_tiny_causal_lm("llama")
    return causal_lm.export_vllm(
        tmp_path_factory.mktemp("good") / "llama",
        golden_prompts=("The", "Hello world"),
        golden_max_new_tokens=4,
    )


@pytest.fixture(scope="module")
def corpus(good_artifact, tmp_path_factory):
    cases = hostile_corpus.make_corpus(
        good_artifact, tmp_path_factory.mktemp("hostile")
    )
    return {name: (path, error) for name, path, error in cases}


@pytest.fixture
def no_vllm(monkeypatch):
    """Makes any attempt to start vLLM fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("validation passed: vLLM would have started")

    fake = types.ModuleType("vllm")
    fake.LLM = refuse
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from keras_vllm.serve import plugin

    monkeypatch.setattr(plugin, "register", refuse)


class _Timeout(BaseException):
    pass


def _guarded(fn, *args, **kwargs):
    def on_alarm(signum, frame):
        raise _Timeout(f"case did not finish within {CASE_TIMEOUT_S}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _expect_refusal(fn, name, path, error):
    with pytest.raises(keras_vllm.KerasVllmError) as info:
        _guarded(fn, path)
    assert type(info.value) is error or isinstance(info.value, error), (
        f"{name}: expected {error.__name__}, got "
        f"{type(info.value).__name__}: {info.value}"
    )
    message = str(info.value)
    pattern = hostile_corpus.EXPECTED_MESSAGES[name]
    assert re.search(pattern, message), f"{name}: {message!r} !~ {pattern!r}"
    return message


def test_good_artifact_loads(good_artifact):
    from keras_vllm.load import keras_loader
    
    opened = fmt.open_artifact(good_artifact)
    fmt.validate_artifact(opened)
    keras_loader.preflight(opened)
    keras_vllm.load_causal_lm(good_artifact)


def test_corpus_size(corpus):
    assert len(corpus) >= 40
    print(f"{len(corpus)} hostile cases")


CASE_NAMES = [name for name, _, _ in hostile_corpus._CASES]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_load_causal_lm_refuses(name, corpus):
    path, error = corpus[name]
    _expect_refusal(keras_vllm.load_causal_lm, name, path, error)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_engine_refuses_before_vllm(name, corpus, no_vllm):
    from keras_vllm.serve.engine.engine import KerasVllmEngine
    from keras_vllm.serve.process.start import jax_started as _jax_started

    path, error = corpus[name]
    started = _jax_started()
    _expect_refusal(KerasVllmEngine.from_export, name, path, error)
    if not started:
        # The refusal ran in this process without starting JAX, so vLLM
        # could still have forked safely.
        assert not _jax_started()


def test_engine_checks_do_not_start_jax(good_artifact, corpus):
    """In a fresh process, the engine's checks (on the good artifact and on a
    refused one) leave JAX unstarted, so vLLM can still fork."""
    import subprocess

    script = f"""
import sys, types
import keras_vllm
from keras_vllm import format as fmt
from keras_vllm.serve.engine.engine import KerasVllmEngine
from keras_vllm.serve import preflight
from keras_vllm.serve.process.start import jax_started as _jax_started
path = {good_artifact!r}
preflight.check(path, deep=True)
try:
    KerasVllmEngine.from_export({corpus['swapped_tokenizer_same_family'][0]!r})
except keras_vllm.IntegrityError as e:
    print("refused:", e)
print("jax started:", _jax_started())
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused:" in result.stdout
    assert "jax started: False" in result.stdout
