"""Which speculative decoding an artifact is served with
(`keras_vllm/serve/speculation.py`), without an engine (well under a
second). Engines that speculate: every family's serving engine
(`helpers/family_serving.py`); the same refusal from every entry point:
`test_vllm_serve_refusals.py`."""

import json
import types

import pytest

from keras_vllm.errors import ServingError
from keras_vllm.serve import preflight
from keras_vllm.serve import speculation

NGRAM = {"method": "ngram", "num_speculative_tokens": 4}


def _artifact(config=None, manifest=None):
    """What `check` reads of an opened artifact."""
    config = {"num_hidden_layers": 4, **(config or {})}
    return types.SimpleNamespace(
        path="/exports/tuned",
        manifest=manifest or {},
        read_json=lambda name: config,
    )


def test_ngram_is_served_and_no_config_is_no_check():
    speculation.check(_artifact(), {"speculative_config": NGRAM})
    speculation.check(_artifact(), {"speculative_config": dict(NGRAM, prompt_lookup_max=3)})
    speculation.check(_artifact(), {})
    # vLLM's own spellings of n-gram.
    speculation.check(_artifact(), {"speculative_config": {
        "model": "[ngram]", "num_speculative_tokens": 2}})


@pytest.mark.parametrize("config, says", [
    ({"method": "draft_model", "model": "org/small", "num_speculative_tokens": 4},
     "separate draft model is not run"),
    # No method and a model: vLLM reads a separate draft model.
    ({"model": "exports/small", "num_speculative_tokens": 4},
     "'draft_model'"),
    ({"method": "eagle3", "model": "org/eagle", "num_speculative_tokens": 3},
     "auxiliary hidden states"),
    ({"method": "dflash", "model": "org/dflash", "num_speculative_tokens": 3},
     "auxiliary hidden states"),
    # MTP drafts with a keras-vllm assistant artifact only (served:
    # test_mtp_speculation.py; refusals with artifacts:
    # tests/export/test_assistant_export.py).
    ({"method": "mtp", "num_speculative_tokens": 1},
     "keras_vllm.export_assistant"),
    ({"method": "gemma4_mtp", "model": "google/gemma-4-E2B-it-assistant",
      "num_speculative_tokens": 1}, "MTP speculation on"),
    ({"method": "suffix", "num_speculative_tokens": 4}, "'suffix' is not one"),
    ({"model": "my_pkg.MyProposer", "num_speculative_tokens": 4},
     "'custom_class'"),
])
def test_methods_the_backend_cannot_run_are_refused_by_name(config, says):
    with pytest.raises(ServingError) as info:
        speculation.check(_artifact(), {"speculative_config": config})
    message = str(info.value)
    assert says in message
    assert "/exports/tuned" in message
    assert '"method": "ngram"' in message  # what works


@pytest.mark.parametrize("config, says", [
    ({"num_speculative_tokens": 4}, "names no method"),
    ({"method": "ngram"}, "'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "positive integer"),
    ('{"method": "ngram"}', "it is a dict"),
])
def test_incomplete_configs_are_refused(config, says):
    with pytest.raises(ServingError, match=says):
        speculation.check(_artifact(), {"speculative_config": config})


def test_layers_whose_writes_depend_on_more_than_their_tokens_are_refused():
    length_keyed = _artifact(manifest={"prefix_caching": False})
    with pytest.raises(ServingError) as info:
        speculation.check(length_keyed, {"speculative_config": NGRAM})
    assert "sequence's length" in str(info.value)
    assert "without speculative_config" in str(info.value)
    # Without speculation it serves as before.
    speculation.check(length_keyed, {})


def test_layers_with_a_recurrent_state_speculate():
    """Recurrent-state layers keep a state per draft position while the
    engine speculates (`gated_delta_rule.conv1d_gdn_windowed`): nothing to
    refuse. Their state rules out prefix caching (`prefix_caching: false`,
    as Qwen 3.5 artifacts declare), which is not the length-keyed case."""
    state = _artifact({
        "recurrent_state_layers": [0, 1, 2],
        "recurrent_state_shapes": [[3, 8], [2, 4, 4]],
        "recurrent_state_dtypes": ["float32", "float32"],
    }, {"prefix_caching": False})
    speculation.check(state, {"speculative_config": NGRAM})


def test_data_parallel_speculation_is_refused():
    with pytest.raises(ServingError, match="data_parallel_size=2"):
        speculation.check(
            _artifact(), {"speculative_config": NGRAM, "data_parallel_size": 2}
        )
    speculation.check(
        _artifact(), {"speculative_config": NGRAM, "data_parallel_size": 1}
    )


@pytest.mark.parametrize("argv, config", [
    (["--speculative-config", json.dumps(NGRAM)], NGRAM),
    (["-sc", json.dumps(NGRAM)], NGRAM),
    (["--speculative-config=" + json.dumps(NGRAM)], NGRAM),
    (["--speculative-config.method", "ngram",
      "--speculative-config.num_speculative_tokens", "4"], NGRAM),
    (["--speculative-config.method=ngram", "--spec-tokens", "4"], NGRAM),
    (["--spec-method", "draft_model", "--spec-model", "org/small",
      "--spec-tokens=3"],
     {"method": "draft_model", "model": "org/small",
      "num_speculative_tokens": 3}),
    (["--speculative-config", '{"method": "eagle3"}',
      "--speculative-config", json.dumps(NGRAM)], NGRAM),  # the last wins
    (["--port", "8000", "--max-model-len", "128"], None),
])
def test_every_spelling_of_the_command_line_is_read(argv, config):
    assert speculation.from_argv(["vllm", "serve", "/a", *argv]) == config
    overrides = preflight.overrides_from_argv(argv)
    assert overrides.get("speculative_config") == config


def test_a_speculative_config_that_is_not_json_is_refused():
    with pytest.raises(ServingError, match="not a JSON object"):
        speculation.from_argv(["--speculative-config", "ngram"])


def test_prompt_logprobs_steps_run_on_a_speculating_runner(monkeypatch):
    """`serve/worker/speculative_prompt_logprobs.py` on a stand-in for
    tpu-inference's runner, which refuses a step with prompt logprobs while
    its `speculative_config` is set (engines: the family modules' prompt
    logprobs checks)."""
    from keras_vllm import format as fmt
    from keras_vllm.serve.worker import speculative_prompt_logprobs as fix

    config = object()

    class Runner:
        def __init__(self, model_type):
            self.model_config = types.SimpleNamespace(
                hf_config=types.SimpleNamespace(model_type=model_type)
            )
            self.speculative_config = config
            self.input_batch = types.SimpleNamespace(num_prompt_logprobs={})
            self.seen = []

        def _prepare_inputs(self):
            self.seen.append(("prepare", self.speculative_config))

        def _execute_model(self):
            self._prepare_inputs()
            if self.speculative_config and self.input_batch.num_prompt_logprobs:
                raise ValueError("prompt_logprobs is not supported")
            return "ran"

    def _prepare_inputs(original):
        # Another replacement of the class's method (prompt_lengths.py's)
        # stays in the step.
        def prepare(self):
            self.seen.append("other replacement")
            return original(self)

        return prepare

    Runner._prepare_inputs = _prepare_inputs(Runner._prepare_inputs)
    Runner._execute_model = fix._step(Runner._execute_model)
    ours, theirs = Runner(fmt.MODEL_TYPE), Runner("llama")
    for runner in (ours, theirs):
        assert runner._execute_model() == "ran"
        runner.input_batch.num_prompt_logprobs["req-1"] = 0
    assert ours._execute_model() == "ran"
    # The drafts were laid out with the config, which is back after the step.
    assert ours.seen[-2:] == ["other replacement", ("prepare", config)]
    assert "_prepare_inputs" not in vars(ours)
    assert ours.speculative_config is config
    with pytest.raises(ValueError):
        theirs._execute_model()
    assert theirs.speculative_config is config


def test_artifacts_that_serve_images_are_refused():
    images = _artifact(manifest={"modalities": {"served": ["text", "image"]}})
    with pytest.raises(ServingError, match="serves images"):
        speculation.check(images, {"speculative_config": NGRAM})
    speculation.check(images, {})


def test_an_assistant_config_is_read_as_an_mtp_drafters():
    """vLLM keeps `method: "mtp"` and shares the target's caches only for
    its MTP draft model type: an assistant artifact's config gets it in
    memory (`serve/hf_config.py`); other configs go to vLLM's own
    override."""
    from transformers import PretrainedConfig

    from keras_vllm import format as fmt
    from keras_vllm.format import assistant as assistant_format
    from keras_vllm.serve import hf_config

    hf_config.install()
    from vllm.config.speculative import SpeculativeConfig

    drafter = PretrainedConfig(architectures=[
        assistant_format.ASSISTANT_ARCHITECTURE])
    drafter.model_type = fmt.MODEL_TYPE
    assert SpeculativeConfig.hf_config_override(drafter).model_type == (
        "gemma4_mtp"
    )
    target = PretrainedConfig(architectures=[fmt.ARCHITECTURE])
    target.model_type = fmt.MODEL_TYPE
    assert SpeculativeConfig.hf_config_override(target).model_type == (
        fmt.MODEL_TYPE
    )
    # What vLLM pickles into its engine process.
    import pickle

    assert pickle.loads(pickle.dumps(SpeculativeConfig.hf_config_override))


def test_the_drafter_takes_the_served_keras_vllm_model():
    """keras-vllm's drafter gets the served model from tpu-inference's MTP
    proposer (`serve/worker/draft_target.py`): loaded outside it, or
    beside a model keras-vllm does not serve, it says so before it reads
    anything (served: test_mtp_speculation.py). Well under a second."""
    from keras_vllm.serve.worker import assistant_model
    from keras_vllm.serve.worker import draft_target

    config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(
            draft_model_config=types.SimpleNamespace(model="/exports/mtp")
        ),
        model_config=types.SimpleNamespace(
            model="/exports/tuned", dtype="float32"
        ),
    )
    drafter = assistant_model.KerasVllmAssistantForCausalLM(config)
    with pytest.raises(ServingError, match="loaded outside it"):
        drafter.load_weights()
    with draft_target.drafting_for(types.SimpleNamespace()):
        with pytest.raises(ServingError, match="with SimpleNamespace"):
            drafter.load_weights()
    assert draft_target.served_target() is None
