"""One rule for what export writes and load accepts (`keras_vllm.hub.pairings`).

keras-hub 0.32's preprocessors take any tokenizer, and its tasks any
backbone. The walk pairs the preprocessor class of every served `CausalLM`
class with the tokenizer class of every served family (tiny tokenizers
trained offline): for each pairing keras-hub builds, export refuses it by
name before writing, or writes a tokenizer the loader takes with that
preprocessor, never one the loader refuses as altered. No model is built
for the walk. One tiny Mixtral then goes through a real export and the
checks an engine start runs with a tokenizer of another class and the same
format, and is refused by name with a tokenizer of another format, a
vocabulary larger than its embedding or another task class.
"""

import os

import keras_hub
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.errors import ArtifactError
from keras_vllm.export import model_facts
from keras_vllm.export import sections
from keras_vllm.load import keras_loader
from keras_vllm.serve import preflight

SERVED = sorted(
    {testing.causal_lm_class(f) for f in testing.FAMILIES},
    key=lambda cls: cls.__name__,
)


@pytest.fixture(scope="module")
def exported_tokenizers(tmp_path_factory):
    """`{tokenizer class name: (tokenizer, its section, its assets)}`: one
    tiny tokenizer per class of the served families, written as export
    writes it."""
    found = {}
    for family in testing.FAMILIES:
        tokenizer = testing.build_tiny_tokenizer(family)
        name = type(tokenizer).__name__
        if name in found:
            continue
        directory = tmp_path_factory.mktemp(name)
        section = sections.tokenizer_section(tokenizer, str(directory))
        found[name] = (
            tokenizer, section, os.path.join(directory, fmt.TOKENIZER_ASSETS_DIR)
        )
    return found


def _load_side(preprocessor, section, assets):
    """What the loader makes of the pairing (None: it builds the tokenizer
    and the preprocessor), as `load_causal_lm` and an engine start do."""
    manifest = {
        "tokenizer": section,
        "preprocessor": sections.serialize(preprocessor, "preprocessor"),
        "backbone": {"config": {}},
    }
    try:
        tokenizer = keras_loader.tokenizer_from_files(manifest, assets)
        keras_loader.build_preprocessor(manifest, tokenizer)
    except ArtifactError as e:
        return str(e)
    return None


@pytest.mark.parametrize("causal_lm_cls", SERVED, ids=lambda c: c.__name__)
def test_export_and_load_agree_on_every_tokenizer(
    causal_lm_cls, exported_tokenizers
):
    preprocessor_cls = causal_lm_cls.preprocessor_cls
    accepted = []
    for name, (tokenizer, section, assets) in exported_tokenizers.items():
        try:
            preprocessor = preprocessor_cls(tokenizer=tokenizer)
        except Exception:  # keras-hub itself refuses the pairing
            continue
        refused = model_facts.tokenizer_pairing_problem(preprocessor)
        loaded = _load_side(preprocessor, section, assets)
        if refused is None:
            assert loaded is None, (name, loaded)
            accepted.append(name)
        else:
            assert preprocessor_cls.__name__ in refused and name in refused
            # The loader refuses what export never writes.
            assert loaded is not None and "pairs a" in loaded, (name, loaded)
    assert preprocessor_cls.tokenizer_cls.__name__ in accepted
    assert len(accepted) < len(exported_tokenizers)


def test_tokenizers_of_one_vocabulary_format_are_taken():
    # Same format (the classes differ in the backbone they name, or in
    # nothing a preprocessor reads): taken. Another format: refused.
    takes = {
        (keras_hub.models.Qwen3_5MoeCausalLMPreprocessor, "qwen3_5"): True,
        (keras_hub.models.Qwen3_5CausalLMPreprocessor, "qwen3_5_moe"): True,
        (keras_hub.models.MixtralCausalLMPreprocessor, "llama"): True,
        (keras_hub.models.Qwen3MoeCausalLMPreprocessor, "qwen3"): True,
        (keras_hub.models.Qwen3CausalLMPreprocessor, "qwen"): False,
        (keras_hub.models.Qwen3_5MoeCausalLMPreprocessor, "qwen3"): False,
        (keras_hub.models.GemmaCausalLMPreprocessor, "gemma3"): False,
    }
    for (preprocessor_cls, family), expected in takes.items():
        preprocessor = preprocessor_cls(
            tokenizer=testing.build_tiny_tokenizer(family)
        )
        problem = model_facts.tokenizer_pairing_problem(preprocessor)
        assert (problem is None) == expected, (preprocessor_cls, family, problem)


@pytest.fixture(scope="module")
def mixtral():
    return testing.build_tiny_causal_lm("mixtral", sequence_length=16)


def _with_tokenizer(causal_lm, tokenizer, task_cls=None):
    preprocessor = type(causal_lm.preprocessor)(
        tokenizer=tokenizer, sequence_length=16
    )
    task_cls = task_cls or type(causal_lm)
    model = task_cls(backbone=causal_lm.backbone, preprocessor=preprocessor)
    model.compile(sampler="greedy")
    return model


def test_a_tokenizer_of_the_same_format_exports_and_passes_the_engine_checks(
    mixtral, tmp_path
):
    # Mixtral's preprocessor holding Llama's tokenizer class (Mixtral's own
    # is the same SentencePiece format). Such an artifact used to export
    # silently and then be refused by the engine as "altered" (so was
    # Qwen 3.5 MoE's with a Qwen3_5Tokenizer, taken in the walk above).
    model = _with_tokenizer(
        mixtral,
        keras_hub.models.LlamaTokenizer(
            proto=mixtral.preprocessor.tokenizer.proto
        ),
    )
    path = model.export_vllm(str(tmp_path / "a"), golden_prompts=())
    preflight.check(path, deep=True)  # what from_export checks before vLLM
    loaded = keras_vllm.load_causal_lm(path)
    assert type(loaded.preprocessor.tokenizer) is keras_hub.models.LlamaTokenizer


def test_pairings_the_loader_refuses_are_refused_at_export(mixtral, tmp_path):
    refused = {
        "another vocabulary format": (
            _with_tokenizer(mixtral, testing.build_tiny_tokenizer("gemma")),
            "MixtralCausalLMPreprocessor takes a MixtralTokenizer .*"
            "GemmaTokenizer is not one",
        ),
        "more ids than embedding rows": (
            _with_tokenizer(
                mixtral,
                testing.build_tiny_tokenizer(
                    "mixtral", mixtral.backbone.vocabulary_size + 64
                ),
            ),
            "vocabulary has \\d+ entries but the backbone's embedding has",
        ),
        "another task class": (
            _with_tokenizer(
                mixtral, mixtral.preprocessor.tokenizer,
                keras_hub.models.MistralCausalLM,
            ),
            "MistralCausalLM takes a MistralBackbone, and a MixtralBackbone "
            "is not one",
        ),
    }
    for case, (model, message) in refused.items():
        target = tmp_path / case.replace(" ", "_")
        with pytest.raises(keras_vllm.UnsupportedModelError, match=message):
            model.export_vllm(str(target))
        assert not os.path.exists(target), case
