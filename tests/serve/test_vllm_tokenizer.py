"""The `keras_vllm` vLLM tokenizer mode over tiny exported artifacts.

Checks the adapter against what `CausalLM.generate()` does (prompt ids),
against the native KerasHub tokenizer (decoding), and against vLLM 0.32's
own machinery: its slow incremental detokenizer driven token by token as
the engine's output processor does, its HfRenderer chat-template path, its
tokenizer/renderer registries and `get_tokenizer`.
"""

import copy
import pickle
import types

import pytest

pytest.importorskip("vllm")

from keras_vllm.hub import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402
from keras_vllm.serve import tokenizer as vllm_tokenizer  # noqa: E402
from keras_vllm.serve.tokenizer import KerasVllmTokenizer  # noqa: E402
from keras_vllm.serve.tokenizer import NoChatTemplateError  # noqa: E402

REPLACEMENT = "\ufffd"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

PROMPTS = [
    "the quick brown fox",
    "héllo wörld 日本 🙂",
    "naïve café — “quotes” ✓ 😀👍🏽 Ω≈ç",
    "  leading and trailing spaces  ",
    "",
]

MULTIBYTE = [
    "héllo wörld 日本 🙂",
    "naïve café — “quotes” ✓ 😀👍🏽",
    "🙂🙂 日本語のテキスト",
]

# (family, chat template or None). One byte-level BPE family and one
# SentencePiece family (with byte fallback); the second has no template.
FAMILIES = {"gpt2": CHAT_TEMPLATE, "llama": None}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    built = {}
    for family, template in FAMILIES.items():
        lm = testing.build_tiny_causal_lm(family)
        path = str(tmp_path_factory.mktemp(f"artifact_{family}"))
        lm.export_vllm(
            path,
            overwrite=True,
            max_sequence_length=256,
            golden_prompts=("the quick",),
            golden_max_new_tokens=2,
            chat_template=template,
        )
        tokenizer = KerasVllmTokenizer.from_pretrained(
            path, truncation_side="left"
        )
        built[family] = types.SimpleNamespace(
            lm=lm, path=path, tokenizer=tokenizer
        )
    return built


@pytest.fixture(params=list(FAMILIES))
def art(request, artifacts):
    return artifacts[request.param]


# ---------------------------------------------------------------------------
# Encoding and decoding
# ---------------------------------------------------------------------------


def test_encode_matches_generate(art):
    tok = art.tokenizer
    for text in PROMPTS:
        expected = reference.prompt_token_ids(art.lm, text)
        assert tok.encode(text) == expected, text
        assert tok(text)["input_ids"] == expected
        assert tok(text)["attention_mask"] == [1] * len(expected)


def test_encode_start_token_policy(art):
    tok = art.tokenizer
    native = art.lm.preprocessor.tokenizer
    start = native.start_token_id
    assert art.lm.preprocessor.add_start_token and start is not None
    assert tok.bos_token_id == start
    assert tok.num_special_tokens_to_add() == 1
    ids = tok.encode("the quick brown fox")
    assert ids[0] == start
    no_bos = tok.encode("the quick brown fox", add_special_tokens=False)
    assert no_bos == ids[1:]
    batch = tok(["a b", "c"], add_special_tokens=False)["input_ids"]
    assert batch == [
        tok.encode(t, add_special_tokens=False) for t in ["a b", "c"]
    ]


def test_truncation_keeps_start_token(art):
    tok = art.tokenizer
    full = tok.encode("the quick brown fox jumps")
    assert tok.truncation_side == "left"
    left = tok.encode(
        "the quick brown fox jumps", truncation=True, max_length=4
    )
    assert left == full[:1] + full[-3:]
    right = copy.copy(tok)
    right.truncation_side = "right"
    assert right.encode(
        "the quick brown fox jumps", truncation=True, max_length=4
    ) == full[:4]
    assert tok.truncation_side == "left"


def test_decode_round_trip_and_native_agreement(art):
    tok = art.tokenizer
    native = art.lm.preprocessor.tokenizer
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == native.detokenize(ids)
        assert tok.decode(ids) == text
        with_bos = tok.encode(text)
        assert tok.decode(with_bos, skip_special_tokens=True) == text
    # Every single token decodes like the native tokenizer.
    for i in range(tok.vocab_size):
        assert tok.decode([i]) == native.detokenize([i]), i
    # Special tokens are skipped on request.
    eos = tok.eos_token_id
    text = "the quick"
    ids = tok.encode(text) + [eos]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_tokens_round_trip(art):
    tok = art.tokenizer
    for text in MULTIBYTE:
        ids = tok.encode(text, add_special_tokens=False)
        tokens = tok.convert_ids_to_tokens(ids)
        assert tok.convert_tokens_to_ids(tokens) == ids
        assert tok.convert_tokens_to_string(tokens) == tok.decode(ids)
    vocab = tok.get_vocab()
    assert len(vocab) == tok.vocab_size == len(tok)
    assert max(vocab.values()) == tok.max_token_id
    assert tok.get_added_vocab() == {}
    longest = max(len(tok.decode([i])) for i in vocab.values())
    assert tok.max_chars_per_token >= longest


def test_special_tokens_and_stops(art):
    tok = art.tokenizer
    native = art.lm.preprocessor.tokenizer
    stops = reference.default_stop_token_ids(native)
    assert tok.eos_token_id == stops[0]
    assert tok.pad_token_id == native.pad_token_id
    assert set(native.special_token_ids) <= set(tok.all_special_ids)
    assert set(stops) <= set(tok.all_special_ids)
    assert tok.all_special_tokens == tok.convert_ids_to_tokens(
        tok.all_special_ids
    )
    assert tok.is_fast is False
    assert tok.name_or_path == art.path


def test_out_of_vocabulary_ids_do_not_crash(art):
    tok = art.tokenizer
    big = [tok.vocab_size, tok.vocab_size + 7, 10**9, -1]
    ids = tok.encode("the quick", add_special_tokens=False)
    assert tok.decode(ids + big) == tok.decode(ids)
    assert tok.decode(big) == ""
    assert tok.convert_ids_to_tokens(big) == [""] * len(big)
    assert tok.convert_ids_to_tokens(tok.vocab_size + 3) == ""
    tokens = ["", "", *tok.convert_ids_to_tokens(ids)]
    assert tok.convert_tokens_to_string(tokens) == tok.decode(ids)
    # vLLM's detokenizer with out-of-vocabulary ids in prompt and output.
    prompt = [5, tok.vocab_size + 1] + ids
    text = _incremental_text(tok, prompt, ids + big, True)
    assert text == _expected_continuation(tok, [5] + ids, ids, True)


# ---------------------------------------------------------------------------
# vLLM's incremental detokenizer
# ---------------------------------------------------------------------------


def _request(prompt_ids, skip_special_tokens, stop=None):
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    return EngineCoreRequest(
        request_id="test",
        prompt_token_ids=list(prompt_ids),
        mm_features=None,
        sampling_params=SamplingParams(
            max_tokens=1000, skip_special_tokens=skip_special_tokens, stop=stop
        ),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


def _incremental_text(
    tok, prompt_ids, output_ids, skip_special_tokens, chunk=1, stop_last=False
):
    """Drives vLLM's detokenizer like its OutputProcessor, delta streaming."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer
    from vllm.v1.engine.detokenizer import SlowIncrementalDetokenizer

    detok = IncrementalDetokenizer.from_new_request(
        tok, _request(prompt_ids, skip_special_tokens)
    )
    assert isinstance(detok, SlowIncrementalDetokenizer)
    deltas = []
    for start in range(0, len(output_ids), chunk):
        step = output_ids[start : start + chunk]
        last = start + chunk >= len(output_ids)
        detok.update(step, stop_terminated=stop_last and last)
        deltas.append(detok.get_next_output_text(finished=False, delta=True))
    deltas.append(detok.get_next_output_text(finished=True, delta=True))
    for delta in deltas:
        assert REPLACEMENT not in delta, deltas
    text = "".join(deltas)
    assert text == detok.get_next_output_text(finished=True, delta=False)
    return text


def _expected_continuation(tok, prompt_ids, output_ids, skip):
    """The one-shot decode of the continuation (as HF/vLLM define it)."""
    prefix = tok.decode(prompt_ids, skip_special_tokens=skip)
    full = tok.decode(
        list(prompt_ids) + list(output_ids), skip_special_tokens=skip
    )
    assert full.startswith(prefix)
    return full[len(prefix) :]


@pytest.mark.parametrize("text", MULTIBYTE)
def test_incremental_detokenization_multibyte(art, text):
    tok = art.tokenizer
    out = tok.encode(text, add_special_tokens=False)
    # The text must really have characters split across tokens.
    pieces = [tok.decode([i]) for i in out]
    assert any(REPLACEMENT in p for p in pieces)

    for prompt_text in ("the quick brown", ""):
        prompt = tok.encode(prompt_text)
        for skip in (True, False):
            expected = _expected_continuation(tok, prompt, out, skip)
            assert REPLACEMENT not in expected
            assert expected.strip() == text.strip()
            for chunk in (1, 3):
                got = _incremental_text(tok, prompt, out, skip, chunk=chunk)
                assert got == expected, (prompt_text, skip, chunk)

    # Generation ending on the stop token, as the engine reports it.
    prompt = tok.encode("the quick brown")
    got = _incremental_text(
        tok, prompt, out + [tok.eos_token_id], True, stop_last=True
    )
    assert got == _expected_continuation(tok, prompt, out, True)


def test_incremental_detokenization_plain_text(art):
    tok = art.tokenizer
    prompt = tok.encode("the quick brown")
    out = tok.encode(" fox jumps over the lazy dog", add_special_tokens=False)
    got = _incremental_text(tok, prompt, out, True)
    assert got == _expected_continuation(tok, prompt, out, True)
    assert got.strip() == "fox jumps over the lazy dog"


def test_special_tokens_kept_without_spaces_between_them(art):
    """`skip_special_tokens=False, spaces_between_special_tokens=False`
    keeps the special tokens, joined without spaces; the special tokens are
    also what the tokenizer reports as added (`added_tokens_decoder`)."""
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    tok = art.tokenizer
    request = _request(tok.encode("the quick"), False)
    request.sampling_params = SamplingParams(
        max_tokens=100, skip_special_tokens=False,
        spaces_between_special_tokens=False,
    )
    detok = IncrementalDetokenizer.from_new_request(tok, request)
    out = tok.encode(" fox", add_special_tokens=False) + [tok.eos_token_id] * 2
    detok.update(out, stop_terminated=False)
    text = detok.get_next_output_text(finished=True, delta=False)
    assert "fox" in text
    assert set(tok.get_added_tokens_decoder()) == set(tok.all_special_ids)
    if tok.vocabulary_kind == "byte_level_bpe":
        # SentencePiece decodes its control tokens to nothing.
        assert text.endswith(tok.eos_token * 2)


# ---------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "héllo 🙂"},
]


def test_chat_template_renders(artifacts):
    tok = artifacts["gpt2"].tokenizer
    bos, eos = tok.bos_token, tok.eos_token
    text = tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert text == (
        f"{bos}<|system|>Be brief.{eos}\n"
        f"<|user|>héllo 🙂{eos}\n<|assistant|>"
    )
    no_prompt = tok.apply_chat_template(MESSAGES, tokenize=False)
    assert not no_prompt.endswith("<|assistant|>")
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # vLLM passes `conversation=` and a resolved template.
    assert tok.apply_chat_template(
        conversation=MESSAGES,
        chat_template=tok.get_chat_template(None),
        tokenize=False,
        add_generation_prompt=True,
    ) == text
    # A per-request template wins; HF's helpers and extra variables work.
    custom = (
        "{% for m in messages %}{{ m['content'] | tojson }}|{{ extra }}"
        "{% generation %}!{% endgeneration %}{% endfor %}"
    )
    assert (
        tok.apply_chat_template(
            MESSAGES[1:], chat_template=custom, tokenize=False, extra="x"
        )
        == '"héllo 🙂"|x!'
    )
    # continue_final_message stops right after the final message.
    cont = tok.apply_chat_template(
        MESSAGES + [{"role": "assistant", "content": "Sure,"}],
        continue_final_message=True,
        tokenize=False,
    )
    assert cont.endswith("<|assistant|>Sure,")


def test_continue_final_message(artifacts):
    tok = artifacts["gpt2"].tokenizer

    def cont(messages, **kwargs):
        return tok.apply_chat_template(
            messages, continue_final_message=True, tokenize=False, **kwargs
        )

    partial = MESSAGES + [{"role": "assistant", "content": "Sure,"}]
    with pytest.raises(ValueError, match="not compatible"):
        cont(partial, add_generation_prompt=True)
    with pytest.raises(ValueError, match="no messages"):
        cont([])
    # A template that drops the final message cannot continue it.
    drops_last = "{% for m in messages[:-1] %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="final message"):
        cont(partial, chat_template=drops_last)
    # Content blocks: the last text block is the one continued.
    blocks = (
        "{% for m in messages %}{% if m['content'] is string %}"
        "{{ m['content'] }}{% else %}{% for b in m['content'] %}"
        "{{ b['text'] }}{% endfor %}{% endif %}|{% endfor %}"
    )
    texts = [{"type": "text", "text": t} for t in ("One.", "Two,")]
    block_messages = MESSAGES + [{"role": "assistant", "content": texts}]
    text = cont(block_messages, chat_template=blocks)
    assert text == "Be brief.|héllo 🙂|One.Two,"
    # The caller's messages are left as they were.
    assert block_messages[-1]["content"][-1]["text"] == "Two,"


def test_byte_decoder_covers_every_byte():
    from keras_vllm.serve.tokenizer.vocabulary import byte_decoder

    table = byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert table["\u0120"] == ord(" ")  # "Ġ", GPT-2's space
    assert all(table[chr(b)] == b for b in range(ord("!"), ord("~") + 1))


def test_chat_template_is_sandboxed(artifacts):
    import jinja2.exceptions

    tok = artifacts["gpt2"].tokenizer
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template(MESSAGES, chat_template=evil, tokenize=False)


def test_no_chat_template_error(artifacts):
    tok = artifacts["llama"].tokenizer
    assert tok.chat_template is None
    with pytest.raises(NoChatTemplateError) as info:
        tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    message = str(info.value)
    assert "has no chat template" in message
    assert "export_vllm(path, chat_template=...)" in message
    # What an HTTP client reads: vLLM's server hides absolute paths.
    from vllm.entrypoints.serve.exception_handling.utils import (
        sanitize_message,
    )

    assert "<path>" not in sanitize_message(message)
    assert isinstance(info.value, ValueError)
    # A template given by the caller still works.
    assert tok.apply_chat_template(
        MESSAGES, chat_template=CHAT_TEMPLATE, tokenize=False
    ).startswith(tok.bos_token)


def _model_config(path):
    return types.SimpleNamespace(
        tokenizer=path,
        model=path,
        tokenizer_revision=None,
        code_revision=None,
        trust_remote_code=False,
        hf_config=types.SimpleNamespace(model_type="keras_vllm"),
    )


def test_vllm_chat_path(artifacts):
    """HfRenderer's own `safe_apply_chat_template`, as the server calls it."""
    from vllm.entrypoints.serve.exception_handling.error_response import (
        create_error_response,
    )
    from vllm.exceptions import VLLMValidationError
    from vllm.renderers.hf import safe_apply_chat_template

    gpt2 = artifacts["gpt2"]
    ids = safe_apply_chat_template(
        _model_config(gpt2.path),
        gpt2.tokenizer,
        MESSAGES,
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    assert ids == gpt2.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True
    )

    llama = artifacts["llama"]
    with pytest.raises(VLLMValidationError) as info:
        safe_apply_chat_template(
            _model_config(llama.path),
            llama.tokenizer,
            MESSAGES,
            tokenize=False,
            add_generation_prompt=True,
        )
    assert "has no chat template" in str(info.value)
    response = create_error_response(info.value)
    assert response.error.code == 400
    assert "export_vllm(path, chat_template=...)" in response.error.message


# ---------------------------------------------------------------------------
# Registration, construction, copying
# ---------------------------------------------------------------------------


def test_registration_coexists_with_keras_hub(artifacts):
    from vllm.renderers.hf import HfRenderer
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    try:
        from keras_hub.src.vllm.plugin import register_keras_hub
    except ImportError:
        register_keras_hub = None
    if register_keras_hub is not None:
        register_keras_hub()
    vllm_tokenizer.register()
    vllm_tokenizer.register()  # idempotent
    if register_keras_hub is not None:
        register_keras_hub()

    ours = TokenizerRegistry.load_tokenizer_cls("keras_vllm")
    assert ours is KerasVllmTokenizer
    assert RENDERER_REGISTRY.load_renderer_cls("keras_vllm") is HfRenderer
    if register_keras_hub is not None:
        other = TokenizerRegistry.load_tokenizer_cls("keras_hub")
        assert other.__name__ == "KerasHubTokenizer"
        assert other is not KerasVllmTokenizer
        assert RENDERER_REGISTRY.load_renderer_cls("keras_hub") is HfRenderer


def test_vllm_get_tokenizer(artifacts):
    """vLLM's own loader: mode lookup, kwargs, truncation side."""
    from vllm.tokenizers.registry import get_tokenizer

    try:  # lets vLLM parse the artifact's config.json without retries
        from keras_vllm.serve import hf_config

        hf_config.register()
    except (ImportError, AttributeError):
        pass
    vllm_tokenizer.register()
    art = artifacts["gpt2"]
    tok = get_tokenizer(
        art.path, tokenizer_mode="keras_vllm", runner_type="generate"
    )
    assert isinstance(tok, KerasVllmTokenizer)
    assert tok.truncation_side == "left"
    assert tok.encode("héllo") == art.tokenizer.encode("héllo")
    assert tok.chat_template == CHAT_TEMPLATE


def test_copy_and_pickle(art):
    tok = art.tokenizer
    text = "héllo wörld 日本 🙂"
    clones = (
        copy.copy(tok),
        copy.deepcopy(tok),
        pickle.loads(pickle.dumps(tok)),
    )
    for clone in clones:
        assert type(clone) is KerasVllmTokenizer
        assert clone.encode(text) == tok.encode(text)
        assert clone.decode(tok.encode(text)) == tok.decode(tok.encode(text))
        assert clone.chat_template == tok.chat_template
    assert hash(tok) == hash(tok)


def test_from_pretrained_never_calls_a_keras_layer(art, monkeypatch):
    """vLLM loads the tokenizer before forking its engine process: a Keras
    layer `__call__` there starts the JAX runtime, which aborts the child."""
    from keras_hub.src.tokenizers.tokenizer import Tokenizer

    calls = []
    original = Tokenizer.__call__

    def spy(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "__call__", spy)
    tok = KerasVllmTokenizer.from_pretrained(art.path)
    tok.encode("héllo wörld")
    tok.decode(tok.encode("héllo wörld"))
    assert calls == [], (
        "Loading or using the tokenizer called a Keras layer; use "
        "`tokenizer.tokenize(text)` instead of `tokenizer(text)`."
    )


def test_from_pretrained_verifies_the_files_it_reads(art, tmp_path):
    """vLLM loads the tokenizer in several processes: hashing gigabytes of
    weights each time is the engine's job (it verifies everything once)."""
    import shutil

    from keras_vllm import format as fmt
    from keras_vllm.errors import IntegrityError

    def flipped(prefix):
        copy_path = tmp_path / prefix.replace("/", "_")
        shutil.copytree(art.path, copy_path)
        manifest = fmt.read_manifest(copy_path)
        # A data file: the adapter parses (validates) the weights' small
        # metadata JSON files, but does not hash the arrays.
        name = sorted(
            (f for f in manifest["files"] if f.startswith(prefix)),
            key=lambda f: (manifest["files"][f]["bytes"] < 2, "/d/" not in f, f),
        )[0]
        with open(copy_path / name, "r+b") as f:
            byte = f.read(1)
            f.seek(0)
            f.write(bytes([byte[0] ^ 1]))
        return str(copy_path), name

    path, _ = flipped(fmt.WEIGHTS_DIR + "/")
    assert KerasVllmTokenizer.from_pretrained(path).encode("the quick")
    path, name = flipped(fmt.TOKENIZER_DIR + "/")
    with pytest.raises(IntegrityError, match=name):
        KerasVllmTokenizer.from_pretrained(path)


GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.mark.parametrize("family", ["gemma", "llama", "llama3", "gpt2"])
def test_rendered_special_tokens_are_the_preprocessors_ids(family, tmp_path):
    """A template's `{{ bos_token }}` renders as text (`<bos>`); the chat's
    ids are what the model's own preprocessor makes of the conversation
    (its start token, then the text), for SentencePiece (control symbols
    and user-defined ones) and byte-level BPE tokenizers alike."""
    import numpy as np

    lm = testing.build_tiny_causal_lm(family)
    path = lm.export_vllm(
        tmp_path / family, golden_prompts=(), chat_template=GEMMA_STYLE_TEMPLATE
    )
    tok = KerasVllmTokenizer.from_pretrained(path)
    messages = [
        {"role": "user", "content": "the quick brown fox"},
        {"role": "model", "content": "jumps over"},
        {"role": "user", "content": "héllo 🙂"},
    ]
    text = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith(tok.bos_token)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    preprocessed = lm.preprocessor.generate_preprocess(
        text[len(tok.bos_token):], sequence_length=256
    )
    mask = np.asarray(preprocessed["padding_mask"]).astype(bool)
    want = [int(i) for i in np.asarray(preprocessed["token_ids"])[mask]]
    assert want[0] == tok.bos_token_id
    assert ids == want
    # What vLLM's renderer does with the text: the same ids.
    assert tok.encode(text, add_special_tokens=False) == want
    # A plain prompt stays as generate() tokenizes it.
    assert tok.encode("the quick") == reference.prompt_token_ids(lm, "the quick")


@pytest.mark.parametrize(
    "family, preset_name",
    [
        ("gemma", "gemma2_instruct_2b_en"),
        ("gemma3", "gemma3_instruct_1b"),
        ("llama3", "llama3_instruct_8b_en"),
        ("llama", "llama2_instruct_7b_en"),
        ("mistral", "mistral_instruct_7b_en"),
        ("qwen", "qwen2.5_instruct_0.5b_en"),
        ("phi3", "phi3_mini_4k_instruct_en"),
    ],
)
def test_instruct_preset_exports_its_familys_chat_format(
    family, preset_name, tmp_path
):
    """A model from an instruction-tuned KerasHub preset (here a tiny one
    saved where keras-hub's download of that preset would lie) exports its
    family's chat format; a conversation renders to the ids the model's
    preprocessor makes of the same text."""
    import keras_hub
    import numpy as np

    from keras_vllm.layers.common import registry

    preset = str(tmp_path / "keras" / preset_name / "1")
    testing.save_tiny_preset(testing.build_tiny_causal_lm(family), preset)
    lm = keras_hub.models.CausalLM.from_preset(preset)
    path = lm.export_vllm(tmp_path / "out", golden_prompts=())
    tok = KerasVllmTokenizer.from_pretrained(path)
    assert tok.chat_template == registry.chat_template(lm.preprocessor.tokenizer)
    assert tok.chat_template is not None
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the quick brown fox"},
        {"role": "assistant", "content": "jumps over"},
        {"role": "user", "content": "héllo 🙂"},
    ]
    text = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    for message in messages:
        assert message["content"] in text
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    bos = tok.bos_token if tok.add_bos_token else ""
    assert text.startswith(bos)
    # The preprocessor's own ids: its start token, then the text, up to the
    # next start or end token written as text (Llama 2 and Mistral chats end
    # each answer with one; the preprocessor adds those only at the ends).
    first = text[len(bos):]
    for special in (bos, tok.eos_token):
        if special and special in first:
            first = first[: first.index(special)]
    preprocessed = lm.preprocessor.generate_preprocess(
        first, sequence_length=256
    )
    mask = np.asarray(preprocessed["padding_mask"]).astype(bool)
    want = [int(i) for i in np.asarray(preprocessed["token_ids"])[mask]]
    assert ids[: len(want)] == want
    for token, token_id in ((bos, tok.bos_token_id),
                            (tok.eos_token, tok.eos_token_id)):
        if token:
            assert ids.count(token_id) == text.count(token), token
    # The base model's preset name: no template (chat needs one given).
    base = str(tmp_path / "keras" / "gemma2_2b_en" / "1")
    if family == "gemma":
        testing.save_tiny_preset(lm, base)
        plain = keras_hub.models.CausalLM.from_preset(base).export_vllm(
            tmp_path / "base", golden_prompts=()
        )
        assert KerasVllmTokenizer.from_pretrained(plain).chat_template is None
