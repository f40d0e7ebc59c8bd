"""The per-family serving checks, shared by the modules that split the
families between them (`test_serving_families.py`, `test_serving_more_
families.py`: each file runs on one test worker, so two files put two
families' engines on the two cores at once).

A module sets its families with `served = served_fixture(FAMILIES)` and
imports the `test_*` functions below, which pytest then collects there.
"""

import pytest

from helpers import gemma3n_encoders
from helpers import serving_checks
from helpers import tiers
from helpers import trained_models
from helpers.trained_models import trained
from keras_vllm.hub import reference

# Every family, each in its tested tiny variant (`trained_models.VARIANTS`:
# rope scaling, windows shorter than the prompts, Gemma 3's global layer,
# Phi-3's "su" RoPE). The tiny Mistral and Mixtral use a 16-token window,
# shorter than the longest prompts.
ALL_FAMILIES = sorted(trained_models.VARIANTS)

# Where greedy expectations come from, when not `generate()`. KerasHub's
# GPT-NeoX `generate()` rotates decode queries at position 0 (its cached
# decoding is wrong), so its reference is greedy decoding by full forward
# passes.
REFERENCE = {
    "gpt_neo_x": reference.greedy_by_forward_pass,
    # Phi-3's "su" RoPE keys its factors off the length a call covers, and
    # `generate()` prefills the prompt padded to `max_length`
    # (`serving_checks.greedy_by_cached_steps`): the reference is Keras'
    # cached decoding with the prompt at its own length, token by token
    # (served so however vLLM chunks the prompt: see ENGINE_KWARGS).
    "phi3": serving_checks.greedy_by_cached_steps,
    # KerasHub's cached `generate()` for Qwen 3.5 lets padding into the
    # linear layers' state and feeds the last prompt token twice.
    "qwen3_5": reference.greedy_by_forward_pass,
    "qwen3_5_moe": reference.greedy_by_forward_pass,
}

# Engine settings per family, on top of `engine_shapes.ENGINE_KWARGS`.
# Qwen 3.5 keeps a recurrent state per sequence: 4 state slots for the 9
# serving prompts (the others queue) and a 32-token step budget, shorter
# than the longest prompts (their prefill is chunked, the state carried
# from chunk to chunk).
# Phi-3 ("su" RoPE, pretraining length 48) gets a 32-token step budget:
# its 63- and 67-token prompts are prefilled in chunks, at boundaries the
# other prompts sharing the budget set, the first ending before the
# pretraining length. Keras prefills a prompt in one call (the long factors
# for all of a 63-token prompt); greedy tokens, prompt logprobs and golden
# outputs must still be Keras'.
ENGINE_KWARGS = {
    "qwen3_5": {"max_num_seqs": 4, "max_num_batched_tokens": 32},
    "qwen3_5_moe": {"max_num_seqs": 4, "max_num_batched_tokens": 32},
    "phi3": {"max_num_batched_tokens": 32},
}


# Every family's engine drafts with n-gram speculation where its artifact
# allows it (`keras_vllm/serve/speculation.py`), so every check below also
# holds with drafts verified several tokens a step, and requests without a
# drafted continuation decode one token a step as without speculation
# (`test_greedy_matches_generate` asserts the batch had rejected drafts,
# test_multi_adapter.py accepted ones too). No engine more: speculation
# costs its start a few programs.
SPECULATIVE = {
    "speculative_config": {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    },
    "per_request_spec_decode_metrics": "summary",
}
# Refused speculation by what its tested artifact declares: the tiny Phi-3's
# "su" RoPE (keys that depend on the step's sequence length,
# `prefix_caching: false`). Qwen 3.5's recurrent-state layers speculate,
# keeping a state per draft position (`gated_delta_rule.
# conv1d_gdn_windowed`).
NOT_SPECULATING = ("phi3",)


def check_drafts_verified(outputs, accepted=True):
    """Verify steps ran in a batch served with `SPECULATIVE`: drafts
    rejected (their KV overwritten by later steps) and, with `accepted`,
    drafts accepted (their KV kept, the bonus token sampled after them).
    Whether a tiny model's greedy output repeats an n-gram of its context
    depends on its fine-tune (the tiny Llama's does not: every draft is
    rejected), so the family checks ask for rejected drafts only; a
    memorized sentence followed by its opening (test_multi_adapter.py) asks
    for both."""
    metrics = [o.outputs[0].spec_decode_metrics for o in outputs]
    drafted = sum(m.num_draft_tokens for m in metrics)
    kept = sum(j * n for m in metrics for j, n in enumerate(m.histogram))
    assert drafted > kept, [(m.num_draft_tokens, m.histogram) for m in metrics]
    if accepted:
        assert kept > 0, [m.histogram for m in metrics]

# The model a family's engine serves, when not its trained text model: every
# KerasHub Gemma 3n preset carries a vision and an audio encoder, so its
# engine serves the trained model with tiny encoders added (the artifact
# stores them; the engine runs the text decoder). The checks compare with
# the text model (the same decoder weights; the encoder model's forward
# pass and `generate()` on text equal it: `tests/layers/test_gemma3n.py`),
# and the golden outputs export records are the encoder model's own.
SERVED_MODELS = {"gemma3n": gemma3n_encoders.with_encoders}


def served_fixture(families):
    """A module fixture: one engine per family, torn down before the next."""

    @pytest.fixture(scope="module", params=families)
    def served(request, tmp_path_factory):
        family = request.param
        model, engine = start_family_engine(
            family, tmp_path_factory.mktemp(family) / "artifact",
            **({} if family in NOT_SPECULATING else SPECULATIVE),
        )
        yield family, model, engine
        serving_checks.shutdown(engine)

    return served


def start_family_engine(
    family, directory, overrides=None, phases=None, **engine_kwargs
):
    """`family`'s trained model (its `VARIANTS` entry plus `overrides`) and
    an engine serving it (`SERVED_MODELS`, with `ENGINE_KWARGS` and
    `engine_kwargs`, which win), exported to `directory`; each step's
    seconds in `phases` when it is a dict."""
    with serving_checks.timed_phase(phases, "model"):
        model = trained(family, **(overrides or {}))
        exported = SERVED_MODELS.get(family, lambda m: m)(model)
    engine = serving_checks.start_engine(
        exported, directory, phases=phases,
        **(ENGINE_KWARGS.get(family, {}) | engine_kwargs),
    )
    return model, engine


def greedy_reference(family):
    """The function `family`'s greedy tokens are compared with."""
    return REFERENCE.get(family, reference.greedy_continuation)


def test_greedy_matches_generate(served):
    family, model, engine = served
    outputs = serving_checks.check_greedy_matches_generate(
        engine, model, greedy=greedy_reference(family)
    )
    if family not in NOT_SPECULATING:
        check_drafts_verified(outputs, accepted=False)


def test_speculation_is_refused_where_it_would_change_output(served):
    """n-gram speculation is refused, before vLLM starts, for the artifacts
    whose layers' writes depend on more than the tokens up to them, and
    served for the others (`keras_vllm.serve.speculation`)."""
    from keras_vllm import format as fmt
    from keras_vllm.errors import ServingError
    from keras_vllm.serve import speculation

    family, _, engine = served
    artifact = fmt.open_artifact(engine.path)
    if family in NOT_SPECULATING:
        with pytest.raises(ServingError, match="would change what"):
            speculation.check(artifact, SPECULATIVE)
    else:
        speculation.check(artifact, SPECULATIVE)


def test_prompt_logprobs_match_forward_pass(served):
    _, model, engine = served
    serving_checks.check_prompt_logprobs(engine, model)


# What the CI tier checks of every family: its engine's greedy tokens,
# prompt logprobs, golden outputs and caches. The exported default sampler
# is read from the manifest whatever the family (~10-15 s a family on 2
# cores, ~40 s for Qwen 3.5's forward-pass reference): checked in the CI
# tier on these families, on the rest in `-m matrix`.
SAMPLER_IN_CI = ("llama", "gpt_oss")
# The golden outputs export recorded, replayed on the engine (~8 s a family:
# the goldens' request shapes compile anew): in the CI tier for the
# families whose goldens come from another reference than `generate()` or
# another model than the served one (the forward pass: GPT-NeoX, Qwen 3.5;
# Gemma 3n's encoder model; Phi-3's prompt-length RoPE factors), Gemma 4
# and Llama; the rest in `-m matrix`. The greedy check above already
# compares every family's engine with the same reference.
GOLDEN_IN_CI = ("llama", "gpt_neo_x", "qwen3_5", "gemma3n", "phi3", "gemma4")
# The family-module cases README's command leaves to `-m matrix`.
in_matrix = tiers.matrix_rule("served", {
    "test_default_sampling_follows_exported_sampler": SAMPLER_IN_CI,
    "test_golden_outputs_replay_on_the_engine": GOLDEN_IN_CI,
})


def test_default_sampling_follows_exported_sampler(served):
    family, model, engine = served
    serving_checks.check_default_sampling_is_the_models(
        engine, model, greedy=greedy_reference(family)
    )


def test_golden_outputs_replay_on_the_engine(served):
    """What `keras-vllm verify --engine` checks (`GOLDEN_IN_CI` says where
    it runs): the golden outputs export recorded (with the family's
    declared reference, the forward pass for GPT-NeoX) are what the engine
    serves."""
    _, _, engine = served
    assert engine.check_golden() == []


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_images_and_audio_are_refused_by_name(served, kind):
    """Every family's artifact serves text only: a request carrying an
    image or an audio clip is refused before it reaches vLLM, naming the
    inputs the artifact stores for Keras-side use when it has encoders
    (Gemma 3n: `images`, `input_features`, `input_features_mask`)."""
    import numpy as np

    import keras_vllm
    from keras_vllm import format as fmt

    _, _, engine = served
    data = {
        "image": np.zeros((16, 16, 3), "uint8"),
        "audio": (np.zeros(1600, "float32"), 16000),
    }[kind]
    with pytest.raises(keras_vllm.ServingError) as raised:
        engine.generate(
            [{"prompt": "the", "multi_modal_data": {kind: data}}]
        )
    message = str(raised.value)
    assert f"multi_modal_data {kind}" in message and "text only" in message
    for name in fmt.unserved_inputs(engine.manifest):
        assert name in message


def test_ids_only_an_unserved_encoder_embeds_are_refused(served):
    """A prompt holding a token id the whole Keras model embeds with an
    encoder the artifact does not serve (Gemma 3n's image and audio
    vocabularies) is refused by name before the engine (its text decoder
    would embed it as text), and the engine serves on; an artifact that
    serves its whole model refuses no id: the top of its vocabulary is
    served. ~0.5 s a family."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from keras_vllm import format as fmt
    from keras_vllm.serve.frontend import encoder_tokens

    family, model, engine = served
    params = SamplingParams(temperature=0.0, max_tokens=2)
    prompt = reference.prompt_token_ids(model, "the")
    ranges = encoder_tokens.refused_ranges(engine.manifest)
    if not fmt.unserved_inputs(engine.manifest):
        assert ranges == []
        top = engine.artifact.read_json(fmt.CONFIG_FILE)["vocab_size"] - 1
        engine.generate([{"prompt_token_ids": prompt + [top]}], params,
                        use_tqdm=False)
        return
    assert ranges, family
    for start, _ in ranges:
        with pytest.raises(VLLMValidationError) as raised:
            engine.generate([{"prompt_token_ids": prompt + [start]}], params,
                            use_tqdm=False)
        assert f"token ids [{start}]" in str(raised.value)
        assert "encoder keras-vllm does not serve" in str(raised.value)
    served_again = engine.generate([{"prompt_token_ids": prompt}], params,
                                   use_tqdm=False)
    assert len(served_again[0].outputs[0].token_ids) == 2


def test_engine_allocates_each_layers_cache(served):
    """vLLM allocates one cache per attention layer that has its own, in the
    shape that layer declares (head size and KV heads differ per layer in
    Gemma 4), and none for layers that share one (KV sharing): those read
    their source layer's cache."""
    from keras_vllm.layers.common.base import cache_of_layer
    from keras_vllm.layers.swap import kv_cache_specs
    from keras_vllm.serve.worker import capacity

    _, model, engine = served
    got = engine.llm.collective_rpc("keras_vllm_kv_caches")[0]
    specs = kv_cache_specs(model.backbone)
    ours = cache_of_layer(specs)
    assert len(got["shapes"]) == len(set(ours))
    theirs = [got["layers"][f"layer.{i}"] for i in range(len(specs))]
    # The same layers share a cache (vLLM may number the caches otherwise).
    for i in range(len(specs)):
        for j in range(len(specs)):
            assert (ours[i] == ours[j]) == (theirs[i] == theirs[j]), (i, j)
    # A layer with a recurrent state gets its declared state arrays, with
    # a slot per request row of the runner's batch (`max_num_seqs` rounded
    # up to its request bucket) plus vLLM's null slot.
    seqs = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
    for i, s in enumerate(specs):
        if getattr(s, "recurrent", False):
            arrays = got["shapes"][theirs[i]]
            assert [a[1:] for a in arrays] == [list(x) for x in s.shapes], i
            assert len({a[0] for a in arrays}) == 1, arrays
            assert arrays[0][0] > seqs, arrays
    # Layers whose padded cache rows differ get differently shaped caches.
    padded = {
        theirs[i]: (s.num_kv_heads, capacity.padded_head_dim(s.head_dim))
        for i, s in enumerate(specs)
        if not getattr(s, "recurrent", False)
    }
    for a in padded:
        for b in padded:
            if padded[a] != padded[b]:
                assert got["shapes"][a] != got["shapes"][b], (a, b)
