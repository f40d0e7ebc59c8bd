"""`vllm serve ARTIFACT` (plain vLLM CLI, our plugin only) over HTTP.

The server splits the model over two devices (`--tensor-parallel-size 2`,
virtual CPU devices the plugin provides): one engine covers plain
`vllm serve` and tensor parallelism over HTTP. Single-device serving over
HTTP is `keras-vllm serve`'s test (`test_cli_engine.py`), which runs this
same `vllm serve` underneath.
"""

import json
import os
import re
import sys

import pytest

pytest.importorskip("tpu_inference")
requests = pytest.importorskip("requests")

from helpers import engine_shapes  # noqa: E402
from helpers.http_server import running_server  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm import testing  # noqa: E402

FAMILY = "llama3"
TENSOR_PARALLEL_SIZE = 2
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def model():
    return trained(FAMILY, **testing.LLAMA3_1_ROPE_SCALING)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    path = model.export_vllm(
        tmp_path_factory.mktemp("serve") / "artifact",
        max_sequence_length=256,
        golden_prompts=testing.prompts()[:2],
        chat_template=CHAT_TEMPLATE,
    )
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    log_path = tmp_path_factory.mktemp("serve_log") / "server.log"
    with running_server(
        [
            vllm,
            "serve",
            path,
            "--tensor-parallel-size",
            str(TENSOR_PARALLEL_SIZE),
            *engine_shapes.SERVE_ARGS,
            # Compact JSON: a tiny model would otherwise pad it with
            # whitespace (allowed by JSON) until max_tokens.
            "--structured-outputs-config",
            json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        ],
        log_path,
        timeout=400,
    ) as url:
        yield url, path


def _text(model, ids):
    """Text of `ids` as vLLM returns it (special tokens skipped)."""
    tokenizer = model.preprocessor.tokenizer
    special = set(tokenizer.special_token_ids)
    return tokenizer.detokenize([i for i in ids if i not in special])


def _complete(url, path, **body):
    response = requests.post(
        url + "/v1/completions", json={"model": path, **body}, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"]


def test_completions_equal_generate(server, model):
    url, path = server
    prompts = testing.prompts()
    choices = _complete(
        url,
        path,
        prompt=prompts,
        max_tokens=16,
        temperature=0.0,
        ignore_eos=True,
        return_token_ids=True,
    )
    wants = reference.greedy_batch(
        model, [reference.prompt_token_ids(model, t) for t in prompts], 16, []
    )
    for choice in choices:
        want = wants[choice["index"]]
        assert choice["token_ids"] == want
        assert choice["text"] == _text(model, want)


def test_request_without_sampling_params_follows_exported_sampler(
    server, model
):
    url, path = server
    text = testing.prompts()[0]
    first = _complete(url, path, prompt=text, max_tokens=12)
    second = _complete(url, path, prompt=text, max_tokens=12)
    assert first[0]["text"] == second[0]["text"]
    ids = reference.prompt_token_ids(model, text)
    stops = reference.default_stop_token_ids(model.preprocessor.tokenizer)
    want = reference.greedy_continuation(model, ids, 12, stops)
    assert first[0]["text"] == _text(model, want)


def test_chat_completion_uses_the_artifact_template(server, model):
    url, path = server
    messages = [{"role": "user", "content": testing.prompts()[1]}]
    response = requests.post(
        url + "/v1/chat/completions",
        json={
            "model": path,
            "messages": messages,
            "max_tokens": 12,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    prompt_ids = body["prompt_token_ids"]
    tokenizer = model.preprocessor.tokenizer
    rendered = f"user: {messages[0]['content']}\nassistant:"
    assert tokenizer.detokenize(
        [i for i in prompt_ids if i not in tokenizer.special_token_ids]
    ) == rendered
    want = reference.greedy_continuation(model, prompt_ids, 12, [])
    assert body["choices"][0]["token_ids"] == want


def test_structured_outputs_follow_the_schema_and_the_regex(server):
    """`response_format` JSON schemas and `structured_outputs` regexes
    constrain decoding over the artifact's own tokenizer (xgrammar)."""
    url, path = server
    schema = {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["answer", "count"],
        "additionalProperties": False,
    }
    response = requests.post(
        url + "/v1/chat/completions",
        json={
            "model": path,
            "messages": [{"role": "user", "content": testing.prompts()[0]}],
            "max_tokens": 48,
            "temperature": 0.0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema},
            },
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    answer = json.loads(choice["message"]["content"])
    assert set(answer) == {"answer", "count"}
    assert answer["answer"] in ("yes", "no") and 0 <= answer["count"] <= 9
    # 12 prompts in one request: vLLM names them "<id>-0" ... "<id>-11",
    # which sort out of scheduling order ("-10" < "-2"); each must still
    # get its own grammar's mask (`serve/worker/grammar_rows.py`).
    pattern = "[a-c]{2,4}-[0-9]"
    prompts = [testing.corpus()[i % len(testing.corpus())] for i in range(12)]
    choices = _complete(
        url, path, prompt=prompts, max_tokens=12, temperature=0.0,
        structured_outputs={"regex": pattern},
    )
    assert len(choices) == len(prompts)
    for choice in choices:
        assert choice["finish_reason"] == "stop", choice
        assert re.fullmatch(pattern, choice["text"]), choice


def test_bad_requests_get_4xx_and_the_server_keeps_serving(server):
    url, path = server
    for body in (
        {"prompt": "a", "max_tokens": -3},
        {"prompt": "a", "temperature": "hot"},
        {"prompt": "a " * 400, "max_tokens": 4},
    ):
        response = requests.post(
            url + "/v1/completions", json={"model": path, **body}, timeout=60
        )
        assert 400 <= response.status_code < 500, (body, response.text)
    assert _complete(url, path, prompt="a", max_tokens=2)


def test_sampling_the_backend_would_not_apply_gets_400_naming_it(server):
    """tpu-inference applies no penalty, min_p, logit_bias or bad_words,
    stops its engine on allowed_token_ids and answers a seed with a bare
    500: each is refused by name, and the server keeps serving."""
    url, path = server
    for name, value in (
        ("repetition_penalty", 1.3),
        ("presence_penalty", 0.5),
        ("logit_bias", {"5": 10}),
        ("allowed_token_ids", [5, 6]),
        ("seed", 3),
    ):
        response = requests.post(
            url + "/v1/completions",
            json={"model": path, "prompt": "a", "max_tokens": 2,
                  "temperature": 0.8, name: value},
            timeout=60,
        )
        assert response.status_code == 400, (name, response.text)
        assert name in response.text
    assert _complete(url, path, prompt="a", max_tokens=2)


def test_64_concurrent_clients_get_exact_answers(server, model):
    """64 clients at once on loopback, a bounded number of requests each:
    none fails or is lost, and every greedy answer equals the sequential one."""
    from concurrent.futures import ThreadPoolExecutor

    url, path = server
    corpus = testing.corpus()
    prompts = [
        " ".join(corpus[i % len(corpus)].split()[: 2 + i % 5]) for i in range(64)
    ]
    texts = sorted(set(prompts))
    rows = reference.greedy_batch(
        model, [reference.prompt_token_ids(model, t) for t in texts], 8, []
    )
    expected = dict(zip(texts, rows))

    def client(text):
        choices = _complete(
            url,
            path,
            prompt=text,
            max_tokens=8,
            temperature=0.0,
            ignore_eos=True,
            return_token_ids=True,
        )
        return text, choices[0]["token_ids"]

    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(client, prompts * 2, timeout=600))
    assert len(results) == 128
    wrong = [(t, got) for t, got in results if got != expected[t]]
    assert not wrong, wrong[:3]


def test_an_image_for_the_text_only_artifact_gets_400_naming_it(server):
    """The artifact serves text only: an `image_url` part is refused by
    keras-vllm's check (`serve/frontend/chat_parts.py`), the server keeps
    serving."""
    url, path = server
    image = "data:image/png;base64," + "iVBORw0KGgo="
    response = requests.post(
        url + "/v1/chat/completions",
        json={
            "model": path,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": testing.prompts()[0]},
                {"type": "image_url", "image_url": {"url": image}},
            ]}],
            "max_tokens": 2,
        },
        timeout=120,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "'image_url'" in message and "serves text only" in message
    assert _complete(url, path, prompt="a", max_tokens=2)
