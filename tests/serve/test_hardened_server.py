"""One `keras-vllm serve --enable-lora --enable-reload --api-key` server
under the attacks of issue 40, over HTTP on loopback.

One tiny GPT-2 base exported full and two LoRA adapters of it (the
fine-tunes `test_multi_adapter.py` serves too), one adapter slot and one
adapter in host memory (`--max-loras 1 --max-cpu-loras 1`), so loading a
second adapter evicts the first. Every case must be refused for its own
request only: after each, the base and the adapters still answer with
their own Keras models' greedy tokens.
"""

import os
import shutil
import sys

import pytest

pytest.importorskip("tpu_inference")
requests = pytest.importorskip("requests")
pytestmark = pytest.mark.serving

from helpers import engine_shapes  # noqa: E402
from helpers import hostile_edits  # noqa: E402
from helpers import hostile_served  # noqa: E402
from helpers.http_server import running_server  # noqa: E402
from helpers.trained_models import lora_fine_tune  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402
from keras_vllm.serve.frontend import refusal_log  # noqa: E402
from keras_vllm.serve.frontend import reload as serve_reload  # noqa: E402
from keras_vllm import testing  # noqa: E402

KEY = "hardened-test-key"
NEW_TOKENS = 8
TEXTS = {
    "support": ["alpha beta gamma alpha beta gamma alpha beta gamma."] * 4,
    "legal": ["water is wet water is wet water is wet water is wet."] * 4,
}
ONE_GOLDEN = {"golden_prompts": testing.prompts()[:1],
              "golden_max_new_tokens": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory, monkeypatch_module):
    root = tmp_path_factory.mktemp("hardened")
    base = str(trained("gpt2").export_vllm(root / "base", **ONE_GOLDEN))
    # The same model exported again: another manifest, so no adapter of
    # the first base fits it.
    other_base = str(trained("gpt2").export_vllm(root / "other", **ONE_GOLDEN))
    models = {None: trained("gpt2")}
    paths = {}
    for name, texts in TEXTS.items():
        models[name] = lora_fine_tune("gpt2", texts, rank=2)
        paths[name] = str(models[name].export_vllm(
            root / name, base=base, **ONE_GOLDEN
        ))
    ids = reference.prompt_token_ids(models[None], testing.prompts()[0])
    stop = fmt.read_manifest(base)["stop_token_ids"]
    expected = {
        name: reference.greedy_batch(model, [ids], NEW_TOKENS, stop)[0]
        for name, model in models.items()
    }
    assert len({tuple(tokens) for tokens in expected.values()}) == 3
    monkeypatch_module.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    command = [
        sys.executable, "-m", "keras_vllm.cli", "serve", base,
        "--enable-lora", "--max-loras", "1", "--max-cpu-loras", "1",
        "--max-lora-rank", "8", "--lora-modules", f"support={paths['support']}",
        "--enable-reload", "--api-key", KEY, *engine_shapes.SERVE_ARGS,
    ]
    with running_server(command, root / "server.log", timeout=500) as url:
        yield {
            "url": url, "base": base, "other_base": other_base,
            "paths": paths, "ids": ids, "expected": expected, "root": root,
            "log": root / "server.log",
        }


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _post(server, route, body):
    return requests.post(
        server["url"] + route, json=body,
        headers={"Authorization": f"Bearer {KEY}"}, timeout=300,
    )


def _complete(server, model):
    response = _post(server, "/v1/completions", {
        "model": model, "prompt": server["ids"], "max_tokens": NEW_TOKENS,
        "temperature": 0.0, "return_token_ids": True,
    })
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def _serves_on(server, *adapters):
    """The base and `adapters` answer exactly; the engine is alive."""
    assert requests.get(server["url"] + "/health", timeout=30).ok
    assert _complete(server, server["base"]) == server["expected"][None]
    for name in adapters:
        assert _complete(server, name) == server["expected"][name], name


def _sibling(server, name, as_name):
    """A copy of an adapter beside it (its base path is relative)."""
    source = server["paths"][name]
    path = os.path.join(os.path.dirname(source), as_name)
    shutil.rmtree(path, ignore_errors=True)
    return str(shutil.copytree(source, path))


def _error(response):
    body = response.json()
    error = body.get("error")
    return error["message"] if isinstance(error, dict) else str(error)


@pytest.mark.parametrize("case", sorted(hostile_served.ADAPTER_CASES))
def test_a_bad_adapter_is_a_400_for_its_own_load(server, case):
    edit, message = hostile_served.ADAPTER_CASES[case]
    path = _sibling(server, "support", f"bad_{case}")
    edit(path)
    response = _post(server, "/v1/load_lora_adapter",
                     {"lora_name": f"bad_{case}", "lora_path": path})
    assert response.status_code == 400, response.text
    assert "keras-vllm: ArtifactError" in _error(response)
    assert path in _error(response)
    import re

    assert re.search(message, _error(response)), response.text
    listed = requests.get(
        server["url"] + "/v1/models",
        headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
    ).json()["data"]
    assert f"bad_{case}" not in {card["id"] for card in listed}
    _serves_on(server, "support")


def test_load_inplace_reads_the_new_path(server, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, says in ((str(empty), "no manifest.json"),
                       (server["base"], "not a LoRA adapter")):
        response = _post(server, "/v1/load_lora_adapter", {
            "lora_name": "support", "lora_path": path, "load_inplace": True,
        })
        assert response.status_code == 400, response.text
        assert says in _error(response)
    _serves_on(server, "support")


def test_an_evicted_adapter_changed_on_disk_never_stops_the_engine(server):
    """`--max-cpu-loras 1`: loading 'legal' evicts 'support' from host
    memory. Its files are then damaged in place: it comes back from the
    factors checked when it was loaded (read once), not from its files."""
    support = _sibling(server, "support", "support_copy")
    response = _post(server, "/v1/load_lora_adapter",
                     {"lora_name": "support_copy", "lora_path": support})
    assert response.status_code == 200, response.text
    assert _complete(server, "support_copy") == server["expected"]["support"]
    legal = _sibling(server, "legal", "legal_copy")
    response = _post(server, "/v1/load_lora_adapter",
                     {"lora_name": "legal", "lora_path": legal})
    assert response.status_code == 200, response.text
    assert _complete(server, "legal") == server["expected"]["legal"]
    hostile_edits.flip(hostile_edits.largest_weight_file(support))
    hostile_served.factor_dtype_recorded_otherwise(support)
    for _ in range(2):  # evicted and brought back, in turns
        assert _complete(server, "support_copy") == (
            server["expected"]["support"]
        )
        assert _complete(server, "legal") == server["expected"]["legal"]
    _serves_on(server, "support", "legal")
    # The damaged copy, loaded again in place, is refused (and the held
    # factors serve on).
    response = _post(server, "/v1/load_lora_adapter", {
        "lora_name": "support_copy", "lora_path": support,
        "load_inplace": True,
    })
    assert response.status_code == 400, response.text
    assert _complete(server, "support_copy") == server["expected"]["support"]


def test_a_reload_refuses_while_adapters_of_the_old_base_are_loaded(server):
    before = fmt.manifest_hash(server["base"])
    response = _post(server, serve_reload.RELOAD_ROUTE,
                     {"path": server["other_base"]})
    assert response.status_code == 409, response.text
    message = _error(response)
    for name in ("support", "legal"):
        assert f"'{name}'" in message, message
    assert "Unload them first" in message
    cards = requests.get(
        server["url"] + "/v1/models",
        headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
    ).json()["data"]
    assert {card["keras_vllm"]["artifact_hash"] for card in cards} == {before}
    _serves_on(server, "support", "legal")


def _new_log_lines(server, start):
    return server["log"].read_bytes()[start:].decode(errors="replace")


def test_each_refusal_is_one_warning_line_in_the_log_without_the_key(
    server, tmp_path
):
    """Issue 52: each refusing route writes one WARNING line to the
    server's log (route, status, keras-vllm error class, message), with no
    traceback and never the API key, not even where the refused path holds
    it or the client sent another key. No generation: each request is
    refused before the engine (about 5 s)."""
    holds_key = tmp_path / f"holds_{KEY}"
    holds_key.mkdir()
    wrong = "not-the-server-key-0451"
    chat = {"model": server["base"], "max_tokens": 2}
    image = {"type": "image_url",
             "image_url": {"url": "data:image/png;base64,AAAA"}}
    reload_route = serve_reload.RELOAD_ROUTE
    cases = [  # (route, body, key, status, error class, the message says)
        ("/v1/load_lora_adapter",
         {"lora_name": "holds", "lora_path": str(holds_key)}, KEY, 400,
         "ArtifactError", "manifest.json"),
        (reload_route, {"path": server["base"]}, wrong, 401,
         "AccessError", "API key"),
        (reload_route, {"path": str(holds_key)}, KEY, 400,
         "ArtifactError", "manifest.json"),
        (reload_route, {"path": server["other_base"]}, KEY, 409,
         "ServingError", "Unload them first"),
        ("/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "hi"}]}, KEY,
         400, "NoChatTemplateError", "has no chat template"),
        ("/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": [image]}]}, KEY,
         400, "RequestError", "serves text only"),
    ]
    for route, body, key, status, kind, says in cases:
        start = server["log"].stat().st_size
        response = requests.post(
            server["url"] + route, json=body,
            headers={"Authorization": f"Bearer {key}"}, timeout=120,
        )
        assert response.status_code == status, response.text
        new = _new_log_lines(server, start)
        lines = [line for line in new.splitlines()
                 if "keras-vllm refused" in line]
        assert len(lines) == 1, (route, new[-3000:])
        assert "WARNING" in lines[0].split("keras-vllm refused")[0], lines
        assert f"keras-vllm refused POST {route} ({status}): {kind}: " in (
            lines[0]
        )
        assert says in lines[0], lines[0]
        # vLLM's own words for the same refusal are not a second line.
        assert "Chat template rejected" not in new
        assert "Traceback" not in new
    log = server["log"].read_text(errors="replace")
    assert KEY not in log and wrong not in log
    assert f"holds_{refusal_log.REDACTED}" in log
    _serves_on(server, "support")
