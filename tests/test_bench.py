"""Smoke test of bench/run.py's machinery: no timing asserted, no engine.

System A runs for real on a tiny model; the engine systems are stood in for
by copies of A's result, so the table, the ratios, the agreement count and
the JSON schema are all exercised. `keras-vllm bench` is checked to reach
the same script.
"""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_run", os.path.join(ROOT, "bench", "run.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompts_are_distinct_and_sized(bench):
    cells = bench.make_cells((4, 8), (1, 3))
    prompts = bench.make_prompts(cells, vocab_size=50, reps=2)
    assert [(c["prompt_len"], c["concurrency"]) for c in prompts["cells"]] == [
        (4, 1), (4, 3), (8, 1), (8, 3)]
    every = [prompts["ttft"]]
    for cell in prompts["cells"]:
        assert len(cell["warmup"]) == cell["concurrency"]
        assert len(cell["timed"]) == 2
        for batch in [cell["warmup"]] + cell["timed"]:
            assert len(batch) == cell["concurrency"]
            assert all(len(p) == cell["prompt_len"] for p in batch)
            every += batch
    for batch in prompts["steps"].values():
        every += batch
    assert sorted(prompts["steps"], key=int) == ["1", "3"]
    assert len({tuple(p) for p in every}) == len(every)
    assert all(0 <= i < 50 for p in every for i in p)


def test_keras_measurement_table_and_schema(bench, tmp_path, monkeypatch):
    from keras_vllm import testing

    monkeypatch.setattr(bench, "STEP_TOKENS", 2)
    causal_lm = testing.build_tiny_causal_lm("qwen")
    cells = bench.make_cells((4,), (1, 2))
    prompts = bench.make_prompts(cells, vocab_size=100)
    result = bench.measure_keras(causal_lm, prompts, max_tokens=3)
    result["ok"] = True
    assert [c["tokens"] for c in result["cells"]] == [3, 6]
    assert all(len(ids) == 3 for c in result["cells"] for ids in c["ids"])
    assert sorted(result["steps"]) == ["1", "2"]

    config = {
        "cells": cells,
        "max_tokens": 3,
        "engine_mode": "inproc",
        "model": bench.MODEL,
    }
    engine = json.loads(json.dumps(result))
    engine["cells"][0]["tok_s"] = result["cells"][0]["tok_s"] / 2
    engine["cells"][1]["ids"][0][0] += 1  # one request differs from A
    systems = {
        "A": result,
        "B": engine,
        "C-seed": {"ok": False, "error": "exit 1"},
        "C": engine,
    }
    doc = bench.assemble(config, systems)
    assert bench.check_results(doc)
    first, second = doc["table"]
    assert first["C/A"] == pytest.approx(0.5)
    assert first["C/B"] == pytest.approx(1.0)
    assert first["C-seed"] is None and first["C/C-seed"] is None
    assert first["C match A"] == [1, 1]
    assert second["C match A"] == [1, 2]
    text = bench.format_report(doc)
    assert "| 4 | 1 |" in text and "C 2/3" in text
    assert "failed: exit 1" in text
    path = tmp_path / "results.json"
    bench._write(str(path), doc)
    assert bench.check_results(json.loads(path.read_text()))

    del doc["table"][0]["C/B"]
    with pytest.raises(ValueError, match="C/B"):
        bench.check_results(doc)


def test_transformers_export_fix(bench, tmp_path):
    from safetensors.numpy import load_file

    from keras_vllm import testing

    causal_lm = testing.build_tiny_causal_lm("qwen")
    directory = str(tmp_path / "hf")
    causal_lm.export_to_transformers(directory)
    changes = bench.fix_transformers_export(directory)
    config = json.load(open(os.path.join(directory, "config.json")))
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert "lm_head.weight" not in load_file(
        os.path.join(directory, "model.safetensors"))
    assert len(changes) == 2
    assert bench.fix_transformers_export(directory) == []


def test_cli_reaches_the_script(monkeypatch):
    from keras_vllm import cli

    seen = {}

    def fake_run_path(path):
        seen["path"] = path
        return {"main": lambda argv: seen.setdefault("argv", argv) and 0}

    monkeypatch.setattr("runpy.run_path", fake_run_path)
    assert cli.main(["bench", "--quick", "--out", "x.json"]) == 0
    assert seen["path"] == os.path.join(ROOT, "bench", "run.py")
    assert seen["argv"] == ["--quick", "--out", "x.json"]
