"""Structured outputs over a keras-vllm artifact's tokenizer
(`keras_vllm/serve/tokenizer/grammar.py`), without an engine: xgrammar
reads the vocabulary as the tokenizer decodes it, grammars accept exactly
the token sequences that spell a match, and special tokens stay out of
JSON grammars. Engines answering structured requests are
`test_vllm_serve.py` (JSON schema over HTTP, byte-level BPE) and
`test_weight_updates.py` (choices and regexes, SentencePiece)."""

import types

import pytest

pytest.importorskip("vllm")
xgr = pytest.importorskip("xgrammar")

from keras_vllm import format as fmt  # noqa: E402
from keras_vllm import testing  # noqa: E402
from keras_vllm.serve.tokenizer import KerasVllmTokenizer  # noqa: E402
from keras_vllm.serve.tokenizer import grammar  # noqa: E402

# Byte-level BPE; SentencePiece with a dummy prefix; without one.
FAMILIES = {
    "gpt2": xgr.VocabType.BYTE_LEVEL,
    "llama": xgr.VocabType.BYTE_FALLBACK,
    "gemma": xgr.VocabType.BYTE_FALLBACK,
}
PATTERN = " ?[a-z]+-[0-9]+"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    built = {}
    for family in FAMILIES:
        path = testing.build_tiny_causal_lm(family).export_vllm(
            tmp_path_factory.mktemp(family) / "artifact",
            max_sequence_length=64, golden_prompts=(),
        )
        built[family] = types.SimpleNamespace(
            path=path,
            tokenizer=KerasVllmTokenizer.from_pretrained(path),
            manifest=fmt.read_manifest(path),
        )
    grammar.install()
    return built


@pytest.fixture(params=list(FAMILIES))
def art(request, artifacts):
    art = artifacts[request.param]
    art.family = request.param
    return art


def test_xgrammar_reads_the_vocabulary_as_the_tokenizer_decodes_it(art):
    tokenizer = art.tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=1000)
    assert info.vocab_type == FAMILIES[art.family]
    assert info.vocab_size == 1000
    assert info.stop_token_ids == art.manifest["stop_token_ids"]
    first = tokenizer.convert_ids_to_tokens(
        tokenizer.encode("a", add_special_tokens=False)
    )[0]
    assert info.add_prefix_space == (first[0] in "\u2581\u0120")
    decoded = info.decoded_vocab
    for text in ("the quick", "brown fox 42\n"):
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            piece = tokenizer.decode([token_id]).encode()
            # SentencePiece's decode drops a leading space of a lone piece.
            assert decoded[token_id] in (piece, b" " + piece)


def _matches(info, tokenizer, text):
    matcher = xgr.GrammarMatcher(
        xgr.GrammarCompiler(info).compile_regex(PATTERN)
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not all(matcher.accept_token(i) for i in ids):
        return False
    return matcher.accept_token(info.stop_token_ids[0]) and (
        matcher.is_terminated()
    )


def test_a_grammar_accepts_exactly_the_tokens_of_a_match(art):
    info = xgr.TokenizerInfo.from_huggingface(art.tokenizer)
    assert _matches(info, art.tokenizer, "fox-42")
    assert not _matches(info, art.tokenizer, "fox-4x")
    assert not _matches(info, art.tokenizer, "fox 42")


def test_special_tokens_stay_out_of_json_grammars(art):
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    tokenizer = art.tokenizer
    special = set(tokenizer.all_special_ids)
    assert special and set(tokenizer.added_tokens_decoder) == special
    full = xgr.TokenizerInfo.from_huggingface(tokenizer)
    filtered = XgrammarBackend._filter_special_tokens(tokenizer, full)
    assert filtered.vocab_type == full.vocab_type
    for token_id in special:
        # An empty piece can never be generated inside a JSON grammar.
        assert full.decoded_vocab[token_id] != b""
        assert filtered.decoded_vocab[token_id] == b""


def test_other_tokenizers_reach_xgrammar_unchanged():
    grammar.install()
    with pytest.raises(ValueError) as info:
        xgr.TokenizerInfo.from_huggingface(object())
    assert "vocabulary of the tokenizer" in str(info.value)  # xgrammar's


def test_each_request_gets_its_own_bitmask_row():
    """vLLM lists the step's structured requests in scheduling order, one
    bitmask row each; tpu-inference 0.32 assigned rows in sorted-id order
    ("10-b" before "9-a"), giving requests each other's masks."""
    import numpy as np

    from keras_vllm.serve.worker import grammar_rows

    runner = types.SimpleNamespace(
        grammar_bitmask_cpu=np.full((4, 2), 7, np.int32),
        require_structured_out_cpu=np.ones(4, bool),
        input_batch=types.SimpleNamespace(
            req_id_to_index={"9-a": 3, "10-b": 0, "11-c": 1, "12-d": 2}
        ),
    )
    output = types.SimpleNamespace(
        structured_output_request_ids=["9-a", "10-b", "gone", "11-c"],
        grammar_bitmask=np.array([[1, 1], [2, 2], [5, 5], [3, 3]], np.int32),
    )
    grammar_rows.fill_rows(runner, output)
    assert runner.grammar_bitmask_cpu.tolist() == [[2, 2], [3, 3], [0, 0], [1, 1]]
    assert runner.require_structured_out_cpu.tolist() == [True, True, False, True]
