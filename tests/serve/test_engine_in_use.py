"""An engine as a user first drives it, in vLLM's default multiprocess mode.

One engine for the module on the tiny llama's artifact, exported without a
chat template: showing `engine.llm` (a notebook cell), `generate()` with
no sampling parameters (the model's own `generate()` length), `chat()`
without a template, and new weights from a live `CausalLM` (which this
mode cannot hand over in memory).
"""

import pytest

pytest.importorskip("tpu_inference")
pytestmark = pytest.mark.serving

from helpers import engine_shapes  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers import updated_models  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402
from keras_vllm.errors import ServingError  # noqa: E402

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import keras_vllm

    path = updated_models.export(
        trained("llama"), tmp_path_factory.mktemp("in_use") / "llama"
    )
    engine = keras_vllm.KerasVllmEngine.from_export(
        path, **engine_shapes.ENGINE_KWARGS
    )
    yield engine
    serving_checks.shutdown(engine)


def test_engine_runs_in_its_own_process(engine):
    from keras_vllm.serve.engine import updates

    assert not updates.in_process(engine.llm)


def test_the_llm_shows_in_a_notebook(engine):
    """vLLM's `LLM.__repr__` asks the worker for its model, which
    tpu-inference's runner cannot give (it has no `get_model`)."""
    text = repr(engine.llm)
    assert "KerasVllmForCausalLM(" in text
    assert "LlamaBackbone(num_layers=2" in text
    assert engine.path in text


def test_generate_without_parameters_runs_as_long_as_generate(engine):
    """No `SamplingParams`: the model's sampler (greedy here) for as many
    tokens as `CausalLM.generate()` makes by default (up to the
    preprocessor's `sequence_length`), not vLLM's 16."""
    causal_lm = trained("llama")
    length = causal_lm.preprocessor.sequence_length
    prompts = testing.prompts()[:3]
    outputs = engine.generate(prompts, use_tqdm=False)
    stops = engine.manifest["stop_token_ids"]
    for text, output in zip(prompts, outputs):
        ids = reference.prompt_token_ids(causal_lm, text)
        want = reference.greedy_continuation(
            causal_lm, ids, length - len(ids), stops
        )
        served = list(output.outputs[0].token_ids)
        assert served == want, text
        assert len(served) > 16 or served[-1] in stops
    # One prompt alone, as token ids: the same budget.
    ids = reference.prompt_token_ids(causal_lm, prompts[0])
    (one,) = engine.generate({"prompt_token_ids": ids}, use_tqdm=False)
    assert list(one.outputs[0].token_ids) == list(outputs[0].outputs[0].token_ids)


def test_chat_without_a_template_names_the_fix(engine):
    with pytest.raises(ServingError, match="chat_template=") as refused:
        engine.chat([{"role": "user", "content": "hi"}])
    assert "has no chat template" in str(refused.value)
    # A template for the call serves it.
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (output,) = engine.chat(
        [{"role": "user", "content": "the quick brown"}],
        chat_template=template,
    )
    causal_lm = trained("llama")
    ids = reference.prompt_token_ids(causal_lm, "the quick brown")
    assert list(output.prompt_token_ids) == ids


def _greedy():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def _served(engine):
    outputs = engine.generate(testing.prompts(), _greedy(), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _expected(causal_lm):
    return serving_checks.expected_batch(
        reference.greedy_continuation,
        causal_lm,
        [reference.prompt_token_ids(causal_lm, t) for t in testing.prompts()],
        NEW_TOKENS,
    )


def test_update_from_a_live_model_in_multiprocess_mode(engine):
    """Written to a temporary export and read by the worker; the engine
    then answers with the live model's weights, labelled `live-1`."""
    old, new = trained("llama"), updated_models.updated_llama()
    assert _served(engine) == _expected(old)
    result = engine.update_weights(new)
    assert result["variables"] == len(new.backbone.weights)
    assert engine.artifact_hash is None
    outputs = engine.generate(testing.prompts(), _greedy(), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == _expected(new)
    assert all(
        {s.version for s in o.outputs[0].weight_versions or ()} == {"live-1"}
        for o in outputs
    )
    with pytest.raises(ServingError, match="its backbone is"):
        engine.update_weights(testing.build_tiny_causal_lm("gpt2"))
    engine.update_weights(engine.path)
    assert _served(engine) == _expected(old)
