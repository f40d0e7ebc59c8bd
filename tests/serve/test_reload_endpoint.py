"""`keras-vllm serve --enable-reload` and `keras-vllm reload` over HTTP.

One server (vLLM's default multiprocess engine, split over two devices:
the update keeps every array's tensor-parallel placement) on the tiny
llama's artifact, with an API key; the new weights are the same model
fine-tuned further (`helpers/updated_models.py`), as in
`test_weight_updates.py`.
"""

import subprocess
import sys
import threading
import types

import pytest

pytest.importorskip("tpu_inference")
requests = pytest.importorskip("requests")

from helpers import engine_shapes  # noqa: E402
from helpers import updated_models  # noqa: E402
from helpers.http_server import running_server  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm.serve.frontend import reload as serve_reload  # noqa: E402
from keras_vllm import testing  # noqa: E402

KEY = "reload-test-key"
NEW_TOKENS = 16
CLI = [sys.executable, "-m", "keras_vllm.cli"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("reload")
    models, paths = updated_models.exported_pair(root)
    old, new = models.old, models.new
    command = [
        *CLI, "serve", paths.old, "--enable-reload", "--api-key", KEY,
        "--tensor-parallel-size", "2", *engine_shapes.SERVE_ARGS,
    ]
    with running_server(command, root / "server.log", timeout=400) as url:
        yield types.SimpleNamespace(
            url=url, old=old, new=new, paths=paths, root=root
        )


def _auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def _expected(causal_lm, *texts):
    """Greedy tokens per text, in one compiled call."""
    ids = [reference.prompt_token_ids(causal_lm, text) for text in texts]
    return reference.greedy_batch(causal_lm, ids, NEW_TOKENS, [])


def _complete(server, prompts):
    response = requests.post(
        server.url + "/v1/completions",
        json={
            "model": server.paths.old, "prompt": prompts,
            "max_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True,
        },
        headers=_auth(),
        timeout=120,
    )
    assert response.status_code == 200, response.text
    choices = sorted(response.json()["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices]


def _served_hash(server):
    response = requests.get(server.url + "/v1/models", headers=_auth(), timeout=30)
    assert response.status_code == 200, response.text
    (card,) = response.json()["data"]
    return card["keras_vllm"]["artifact_hash"]


def _reload(server, path, *options):
    return subprocess.run(
        [*CLI, "reload", server.url, path, *options],
        capture_output=True, text=True, timeout=300,
    )


def test_reload_refuses_without_the_key_then_swaps_the_weights(server):
    prompts = testing.prompts()
    old_tokens = _expected(server.old, *prompts)
    new_tokens = _expected(server.new, *prompts)
    assert _complete(server, prompts) == old_tokens
    assert _served_hash(server) == fmt.manifest_hash(server.paths.old)

    for headers in ({}, _auth("wrong")):
        response = requests.post(
            server.url + serve_reload.RELOAD_ROUTE,
            json={"path": server.paths.new}, headers=headers, timeout=60,
        )
        assert response.status_code == 401, response.text
        assert "API key" in response.json()["error"]
    refused = _reload(server, server.paths.new)
    assert refused.returncode == 3 and "401" in refused.stderr
    assert _complete(server, prompts) == old_tokens

    # Requests in flight while the weights change: each answered by one
    # model (the scheduler lets running ones finish, queues new ones).
    answers, errors = [], []
    reloaded = threading.Event()

    def client(index):
        try:
            # Until two requests after the reload answered.
            late = 0
            while late < 2:
                late += reloaded.is_set()
                answers.append((index, _complete(server, [prompts[index]])[0]))
        except Exception as e:  # noqa: BLE001  (the test reports any)
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    done = _reload(server, server.paths.new, "--api-key", KEY)
    reloaded.set()
    for thread in threads:
        thread.join(timeout=300)
    assert done.returncode == 0, done.stderr
    assert "reloaded" in done.stdout
    assert not errors, errors
    sides = set()
    for index, tokens in answers:
        assert tokens in (old_tokens[index], new_tokens[index])
        sides.add(tokens == new_tokens[index])
    assert sides == {False, True}, "no request on one side of the reload"
    assert _complete(server, prompts) == new_tokens
    assert _served_hash(server) == fmt.manifest_hash(server.paths.new)


def test_incompatible_export_is_refused_over_http(server):
    other = updated_models.export(
        testing.build_tiny_causal_lm("gpt2"), server.root / "gpt2"
    )
    before = _served_hash(server)
    refused = _reload(server, other, "--api-key", KEY)
    assert refused.returncode == 3
    assert "400" in refused.stderr and "its backbone is" in refused.stderr
    assert _served_hash(server) == before
    expected = server.new if before == fmt.manifest_hash(
        server.paths.new
    ) else server.old
    prompt = testing.prompts()[0]
    assert _complete(server, [prompt]) == _expected(expected, prompt)


def test_without_a_key_only_loopback_clients_may_reload(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    def request(host):
        return types.SimpleNamespace(
            app=types.SimpleNamespace(
                state=types.SimpleNamespace(
                    args=types.SimpleNamespace(api_key=None)
                )
            ),
            client=types.SimpleNamespace(host=host),
            headers={},
        )

    assert serve_reload._refusal(request("127.0.0.1")) is None
    refused = serve_reload._refusal(request("10.1.2.3"))
    assert refused.status_code == 403
    assert b"loopback" in refused.body


def test_serve_adds_the_route_only_when_asked():
    from keras_vllm.cli import reload as cli_reload

    args = types.SimpleNamespace(vllm_args=["--port", "1"], enable_reload=False)
    assert cli_reload.serve_arguments(args) == []
    args.vllm_args.append("--enable-reload")
    added = cli_reload.serve_arguments(args)
    assert args.vllm_args == ["--port", "1"]
    assert added[:2] == ["--middleware", serve_reload.MIDDLEWARE]
    assert "--worker-extension-cls" in added


def test_chat_on_an_artifact_without_a_template_is_a_clear_400(server):
    """Not about reloads: this server's artifact has no chat template, and
    `/v1/chat/completions` says so (and how to add one) with a 400."""
    response = requests.post(
        server.url + "/v1/chat/completions",
        json={
            "model": server.paths.old,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
        headers=_auth(),
        timeout=120,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "has no chat template" in message, message
    assert "chat_template=" in message, message
