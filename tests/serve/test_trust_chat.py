"""Chat templates render bounded in output, work and time (issue 13, item 3).

At the tokenizer adapter vLLM's front-end process uses: a hostile template
fails its request with `ChatTemplateLimitError` (a `ValueError`, which
vLLM's OpenAI server answers with HTTP 400), and the same tokenizer keeps
rendering ordinary requests afterwards.
"""

import time

import pytest

import keras_vllm
from helpers.trained_models import trained
from keras_vllm import testing
from keras_vllm.errors import KerasVllmError
from keras_vllm.serve.tokenizer import KerasVllmTokenizer
from keras_vllm.serve.tokenizer import bounded_jinja

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
MESSAGES = [{"role": "user", "content": "hi"}]

BOMBS = {
    "repeat": "{{ 'x' * 1000000000 }}",
    "power": "{{ 10 ** (10 ** 9) }}",
    "empty_nested_loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}"
        "{% endfor %}{% endfor %}"
    ),
    "output_loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx"
        "{% endfor %}{% endfor %}"
    ),
    "center_filter": "{{ 'x'|center(1000000000) }}",
    "str_method": "{{ 'x'.ljust(1000000000) }}",
    "format_width": "{{ '%01000000000d' % 1 }}",
    "captured_macro": (
        "{% macro m() %}{% for i in range(100000) %}xxxxxxxxxx{% endfor %}"
        "{% endmacro %}{% set x %}{% for i in range(100000) %}{{ m() }}"
        "{% endfor %}{% endset %}{{ x|length }}"
    ),
    "join_copies": "{% set s = 'x' * 1000000 %}{{ ([s] * 100000)|join }}",
    "doubling_list": (
        "{% set ns = namespace(l=['x' * 1000]) %}{% for i in range(64) %}"
        "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"
    ),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    causal_lm = testing.build_tiny_causal_lm("llama")
    path = causal_lm.export_vllm(
        tmp_path_factory.mktemp("chat") / "llama",
        golden_prompts=("The",),
        golden_max_new_tokens=2,
        chat_template=TEMPLATE,
    )
    return KerasVllmTokenizer.from_pretrained(path)


def test_ordinary_template_renders(tokenizer):
    text = tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert text == "<user>hi<assistant>"
    continued = tokenizer.apply_chat_template(
        MESSAGES + [{"role": "assistant", "content": "hello "}],
        tokenize=False,
        continue_final_message=True,
    )
    assert continued == "<user>hi<assistant>hello "


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_hostile_template_is_refused_and_server_keeps_serving(tokenizer, name):
    started = time.monotonic()
    with pytest.raises(bounded_jinja.ChatTemplateLimitError) as info:
        tokenizer.apply_chat_template(
            MESSAGES, chat_template=BOMBS[name], tokenize=False
        )
    assert isinstance(info.value, ValueError)  # vLLM answers 400
    assert isinstance(info.value, KerasVllmError)
    assert "chat template" in str(info.value)
    assert time.monotonic() - started < bounded_jinja.MAX_SECONDS + 6
    # The same tokenizer serves the next request.
    assert tokenizer.apply_chat_template(MESSAGES, tokenize=False) == "<user>hi"


@pytest.mark.parametrize(
    "template, warns",
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", True),
        ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
         False),
        ("<|endoftext|>{% for m in messages %}{{ m['content'] }}{% endfor %}",
         False),
    ],
)
def test_a_template_without_the_start_token_is_warned_about(
    template, warns, tmp_path, caplog
):
    """Chats are tokenized without special tokens (vLLM, as Hugging Face):
    a template that never writes the start token the preprocessor adds
    shows the model prompts it was not trained on."""
    with caplog.at_level("WARNING", logger="keras_vllm"):
        keras_vllm.export_vllm(
            trained("gpt2"), str(tmp_path / "out"), chat_template=template,
            golden_prompts=(),
        )
    warned = "never writes the start token" in caplog.text
    assert warned == warns, caplog.text
