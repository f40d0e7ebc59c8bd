"""New weights for a running engine (`KerasVllmEngine.update_weights`).

One engine for the module, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
the mode in which a live Keras model's arrays are handed over in memory), on
the tiny llama's artifact. The new weights are the same model fine-tuned
further on other token sequences, exported to a second directory. Exports go
through the same worker method in vLLM's default multiprocess mode (plain
values over `collective_rpc`), where a live model is exported to a temporary
artifact first (tests/serve/test_engine_in_use.py). The
same engine also shows two request checks that need an engine but no
update (refused sampling parameters, structured outputs over a
SentencePiece tokenizer). What `shutdown()` frees is checked where no
other engine holds the device (tests/serve/test_engine_shutdown.py).
"""

import logging
import os
import threading
import time
import types

import pytest

pytest.importorskip("tpu_inference")

from helpers import engine_shapes  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers import updated_models  # noqa: E402
from keras_vllm.load import update_checks  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402
from keras_vllm.errors import ServingError  # noqa: E402
from keras_vllm.serve.worker import weight_update  # noqa: E402

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import keras_vllm

    root = tmp_path_factory.mktemp("updates")
    models, paths = updated_models.exported_pair(root)
    old, new = models.old, models.new
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        start = time.perf_counter()
        engine = keras_vllm.KerasVllmEngine.from_export(
            paths.old, **engine_shapes.ENGINE_KWARGS
        )
        cold_start = time.perf_counter() - start
        yield types.SimpleNamespace(
            engine=engine, old=old, new=new, paths=paths, root=root,
            cold_start=cold_start,
        )
        serving_checks.shutdown(engine)


def _expected(causal_lm):
    return serving_checks.expected_batch(
        reference.greedy_continuation,
        causal_lm,
        [reference.prompt_token_ids(causal_lm, t) for t in testing.prompts()],
        NEW_TOKENS,
    )


def _params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def _served(engine, prompts=None):
    outputs = engine.generate(
        prompts or testing.prompts(), _params(), use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


def _versions(output):
    return {span.version for span in output.outputs[0].weight_versions or ()}


class _Compilations(logging.Handler):
    """Every program JAX lowers (a cache hit in memory lowers nothing; a
    retrace, even one the persistent cache then serves, does)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.programs = []

    def emit(self, record):
        if record.getMessage().startswith("Compiling"):
            self.programs.append(record.getMessage()[:120])

    def __enter__(self):
        self._logger = logging.getLogger("jax._src.interpreters.pxla")
        self._level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc_info):
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def _back_to_old(setup):
    setup.engine.update_weights(setup.paths.old)
    assert _served(setup.engine) == _expected(setup.old)


def test_update_from_export_serves_the_new_weights(setup):
    engine, old_tokens = setup.engine, _expected(setup.old)
    new_tokens = _expected(setup.new)
    assert old_tokens != new_tokens
    assert _served(engine) == old_tokens
    old_hash = engine.artifact_hash
    assert old_hash == fmt.manifest_hash(setup.paths.old)
    with _Compilations() as compiled:
        result = engine.update_weights(setup.paths.new)
        outputs = engine.generate(testing.prompts(), _params(), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == new_tokens
    # Same shapes, dtypes and shardings: every program is reused.
    assert compiled.programs == []
    new_hash = fmt.manifest_hash(setup.paths.new)
    assert engine.artifact_hash == new_hash != old_hash
    assert engine.path == os.path.abspath(setup.paths.new)
    assert all(_versions(o) == {new_hash} for o in outputs)
    assert result["variables"] == len(setup.new.backbone.weights)
    # Measured here: 1.4-3.2 s against a 12-22 s cold start (in-process,
    # compile-on-demand); the bound leaves room for a start that found its
    # programs in the session's persistent compile cache.
    print(f"update {result['seconds']:.2f} s, cold start {setup.cold_start:.1f} s")
    assert result["seconds"] < 0.5 * setup.cold_start
    _back_to_old(setup)


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        ("gpt2", {}, "its backbone is"),
        ("llama", {"intermediate_dim": 96}, "intermediate_dim=96"),
    ],
    ids=["other-family", "other-shapes"],
)
def test_incompatible_export_is_refused(setup, family, overrides, message):
    other = testing.build_tiny_causal_lm(family, **overrides)
    path = updated_models.export(
        other, setup.root / f"{family}_{len(overrides)}"
    )
    with pytest.raises(ServingError, match=message) as info:
        setup.engine.update_weights(path)
    assert "from_export" in str(info.value)
    assert setup.engine.artifact_hash == fmt.manifest_hash(
        setup.paths.old
    )
    assert _served(setup.engine) == _expected(setup.old)


def test_requests_during_an_update_are_answered_by_one_model(setup):
    engine = setup.engine
    prompts = testing.prompts()
    old_tokens, new_tokens = _expected(setup.old), _expected(setup.new)
    versions = {
        fmt.manifest_hash(setup.paths.old): old_tokens,
        fmt.manifest_hash(setup.paths.new): new_tokens,
    }
    answers, errors = [], []
    updated = threading.Event()

    def client(index):
        try:
            # Until two requests after the update, so some land on each side.
            late = 0
            while late < 2:
                late += updated.is_set()
                out = engine.generate([prompts[index]], _params(), use_tqdm=False)
                answers.append((index, out[0]))
        except Exception as e:  # noqa: BLE001  (the test reports any)
            errors.append(e)

    threads = [
        threading.Thread(target=client, args=(i,)) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    engine.update_weights(setup.paths.new)
    updated.set()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert all(not thread.is_alive() for thread in threads)
    seen = set()
    for index, output in answers:
        (version,) = _versions(output)  # one set of weights per request
        assert list(output.outputs[0].token_ids) == versions[version][index]
        seen.add(version)
    assert seen == set(versions), "no request on one side of the update"
    _back_to_old(setup)


def test_update_from_a_delta_export(setup):
    """A delta export's whole weight set (its preset plus its delta) replaces
    the served one: here the old model's preset with the new weights."""
    import keras_hub

    from keras_vllm import format as fmt

    preset = testing.save_tiny_preset(setup.old, setup.root / "old_preset")
    model = keras_hub.models.CausalLM.from_preset(preset)
    # The served sampler (a preset loads with KerasHub's default one,
    # whose generation_config.json an update refuses).
    model.compile(sampler="greedy")
    model.set_weights(setup.new.get_weights())
    # Every variable moved: "auto" would store it full; a delta is asked.
    path = model.export_vllm(
        setup.root / "delta", weights="delta", max_sequence_length=256,
        golden_prompts=testing.prompts()[:2],
    )
    assert fmt.open_artifact(path).manifest["weights"]["mode"] == "delta"
    setup.engine.update_weights(path)
    assert _served(setup.engine) == _expected(setup.new)
    _back_to_old(setup)


def test_update_from_a_live_model(setup):
    engine = setup.engine
    engine.update_weights(setup.new)
    assert engine.artifact_hash is None
    outputs = engine.generate(testing.prompts(), _params(), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == _expected(setup.new)
    assert all(_versions(o) == {"live-1"} for o in outputs)
    with pytest.raises(ServingError, match="its backbone is"):
        engine.update_weights(testing.build_tiny_causal_lm("gpt2"))
    assert _served(engine) == _expected(setup.new)
    _back_to_old(setup)


# No engine needed below: the checks run on manifests and variables.


def _manifest(setup):
    from keras_vllm import format as fmt

    return fmt.open_artifact(setup.paths.old, verify=False).manifest


def test_other_tokenizer_or_vllm_files_are_refused(setup):
    import copy

    running = _manifest(setup)
    update_checks.check_compatible(running, copy.deepcopy(running), "same")
    cases = {
        "its tokenizer differs": ("files", "tokenizer/assets/"),
        "generation_config.json' differs": ("files", "generation_config.json"),
    }
    for message, (_, prefix) in cases.items():
        incoming = copy.deepcopy(running)
        rel = next(r for r in incoming["files"] if r.startswith(prefix))
        incoming["files"][rel]["sha256"] = "0" * 64
        with pytest.raises(ServingError, match=message):
            update_checks.check_compatible(running, incoming, "The export")
    incoming = copy.deepcopy(running)
    incoming["dtype"] = "bfloat16"
    with pytest.raises(ServingError, match="its dtype is bfloat16"):
        update_checks.check_compatible(running, incoming, "The export")


def test_variables_of_other_shape_or_dtype_are_refused():
    def variable(path, shape, dtype="float32"):
        return types.SimpleNamespace(path=path, shape=shape, dtype=dtype)

    served = [(variable("a/kernel", (2, 3)), None)]
    for incoming, message in [
        ([(variable("a/kernel", (2, 4)), variable("", (2, 4)))], "shape"),
        ([(variable("a/kernel", (2, 3)), variable("", (2, 3), "bfloat16"))],
         "bfloat16"),
        ([(variable("b/kernel", (2, 3)), variable("", (2, 3)))], "b/kernel"),
        ([], "0 variables"),
    ]:
        with pytest.raises(ServingError, match=message):
            weight_update.check_same_variables(served, incoming, "New")


def test_sampling_the_backend_would_not_apply_is_refused(setup):
    """Not about updates: the module's engine shows `generate` refusing what
    tpu-inference would ignore or die on (`serve/frontend/sampling.py`), then
    serving on."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    prompt = testing.prompts()[:1]
    for name, value in (("frequency_penalty", 0.7), ("allowed_token_ids", [3])):
        params = SamplingParams(max_tokens=4, **{name: value})
        with pytest.raises(VLLMValidationError, match=name):
            setup.engine.generate(prompt, params, use_tqdm=False)
    assert all(len(ids) == NEW_TOKENS for ids in _served(setup.engine))


def test_structured_outputs_over_a_sentence_piece_tokenizer(setup):
    """Not about updates either: choices and regexes constrain `generate`
    over the artifact's SentencePiece tokenizer (xgrammar)."""
    import re

    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    prompts = testing.prompts()[:3]
    options = ["yes", "no", "maybe so"]
    pattern = "[a-c]{2,4}-[0-9]"
    for constraint, check in (
        (StructuredOutputsParams(choice=options), lambda t: t in options),
        (StructuredOutputsParams(regex=pattern),
         lambda t: re.fullmatch(pattern, t)),
    ):
        params = SamplingParams(
            temperature=0.0, max_tokens=12, structured_outputs=constraint
        )
        for output in setup.engine.generate(prompts, params, use_tqdm=False):
            text = output.outputs[0].text
            assert check(text), text
            assert output.outputs[0].finish_reason == "stop"


_EXPORT_LLAMA3 = """
import sys
from keras_vllm import testing
testing.build_tiny_causal_lm("llama3").export_vllm(sys.argv[1], golden_prompts=[])
"""


def test_the_same_model_exported_in_two_processes_is_compatible(tmp_path):
    """keras-hub's `Llama3Tokenizer` lists its unsplittable tokens from a
    set, in another order in each process (`PYTHONHASHSEED`): the same
    tokenizer, so an update is accepted. A quantized export is not."""
    import copy
    import json
    import os
    import subprocess
    import sys

    manifests = []
    for seed in ("1", "2"):
        out = str(tmp_path / f"seed{seed}")
        subprocess.run(
            [sys.executable, "-c", _EXPORT_LLAMA3, out], check=True,
            env=dict(os.environ, PYTHONHASHSEED=seed), capture_output=True,
        )
        with open(os.path.join(out, "manifest.json")) as f:
            manifests.append(json.load(f))
    running, incoming = manifests
    orders = [m["tokenizer"]["config"]["unsplittable_tokens"] for m in manifests]
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])
    update_checks.check_compatible(running, incoming, "The export")

    fewer = copy.deepcopy(incoming)
    fewer["tokenizer"]["config"]["unsplittable_tokens"].pop()
    with pytest.raises(ServingError, match="its tokenizer differs"):
        update_checks.check_compatible(running, fewer, "The export")
    quantized = copy.deepcopy(incoming)
    quantized["quantization"] = {"layers": {"layer/kernel": "int8_from_float32"}}
    with pytest.raises(ServingError, match=r"quantized \(int8_from_float32\), "
                       "the served ones not quantized"):
        update_checks.check_compatible(running, quantized, "The export")
