"""Smoke test of keras_vllm.bench's machinery: no timing asserted, no engine.

System A runs for real on a tiny model; the engine systems are stood in for
by copies of A's result, so the table, the ratios, the agreement count and
the JSON schema are all exercised. `keras-vllm bench` is checked to reach
the same `main`, and to run from outside the repository.
"""

import json
import os
import subprocess
import sys

import pytest

from keras_vllm.bench import cells as cells_lib
from keras_vllm.bench import measure
from keras_vllm.bench import models
from keras_vllm.bench import prepare
from keras_vllm.bench import report


def test_prompts_are_distinct_and_sized():
    cells = cells_lib.make_cells((4, 8), (1, 3))
    prompts = cells_lib.make_prompts(cells, vocab_size=50, reps=2)
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


def test_keras_measurement_table_and_schema(tmp_path, monkeypatch):
    from keras_vllm import testing

    monkeypatch.setattr(measure, "STEP_TOKENS", 2)
    causal_lm = testing.build_tiny_causal_lm("qwen")
    cells = cells_lib.make_cells((4,), (1, 2))
    prompts = cells_lib.make_prompts(cells, vocab_size=100)
    result = measure.measure_keras(causal_lm, prompts, max_tokens=3)
    result["ok"] = True
    assert [c["tokens"] for c in result["cells"]] == [3, 6]
    assert all(len(ids) == 3 for c in result["cells"] for ids in c["ids"])
    assert sorted(result["steps"]) == ["1", "2"]

    config = {
        "cells": cells,
        "max_tokens": 3,
        "engine_mode": "inproc",
        "model": models.config("tiny"),
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
    doc = report.assemble(config, systems)
    assert report.check_results(doc)
    first, second = doc["table"]
    assert first["C/A"] == pytest.approx(0.5)
    assert first["C/B"] == pytest.approx(1.0)
    assert first["C-seed"] is None and first["C/C-seed"] is None
    assert first["C match A"] == [1, 1]
    assert second["C match A"] == [1, 2]
    text = report.format_report(doc)
    assert "| 4 | 1 |" in text and "C 2/3" in text
    assert "failed: exit 1" in text
    path = tmp_path / "results.json"
    report.write(str(path), doc)
    assert report.check_results(json.loads(path.read_text()))

    del doc["table"][0]["C/B"]
    with pytest.raises(ValueError, match="C/B"):
        report.check_results(doc)


def test_transformers_export_fix(tmp_path):
    from safetensors.numpy import load_file

    from keras_vllm import testing

    causal_lm = testing.build_tiny_causal_lm("qwen")
    directory = str(tmp_path / "hf")
    causal_lm.export_to_transformers(directory)
    changes = prepare.fix_transformers_export(directory)
    config = json.load(open(os.path.join(directory, "config.json")))
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert "lm_head.weight" not in load_file(
        os.path.join(directory, "model.safetensors"))
    assert len(changes) == 2
    assert prepare.fix_transformers_export(directory) == []


@pytest.mark.parametrize("family", ["gpt2", "llama3", "gemma3"])
def test_transformers_export_fix_names_the_seed_table_families(
    tmp_path, family
):
    """B's checkpoints of the seed table's models (#58) get their Hugging
    Face architecture and the weights' dtype. ~3 s a family."""
    from keras_vllm import testing

    causal_lm = testing.build_tiny_causal_lm(family, dtype="bfloat16")
    directory = str(tmp_path / "hf")
    causal_lm.export_to_transformers(directory)
    prepare.fix_transformers_export(directory, "bfloat16")
    config = json.load(open(os.path.join(directory, "config.json")))
    assert config["architectures"] == [{
        "gpt2": "GPT2LMHeadModel", "llama3": "LlamaForCausalLM",
        "gemma3": "Gemma3ForCausalLM"}[family]]
    assert config["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("name", ["gpt2_large", "llama3_1b", "gemma3_1b"])
def test_seed_table_models_build_in_bfloat16(name):
    """The seed table's models (#58) as the chip builds them, one layer
    deep: bfloat16 weights, the real vocabulary's size, prompts clear of
    special ids. ~2-4 s each (zeros for the random draws of real-sized
    embeddings: 20 s with them)."""
    from helpers import trained_models

    with trained_models.without_random_init():
        causal_lm = models.build(name, num_layers=1)
    embeddings = causal_lm.backbone.token_embedding.embeddings
    assert embeddings.dtype == "bfloat16"
    tokenizer = causal_lm.preprocessor.tokenizer
    size = models.MODELS[name]["vocabulary_size"]
    assert tokenizer.vocabulary_size() == embeddings.shape[0] == size
    first, limit = prepare.prompt_id_range(tokenizer)
    special = {int(i) for i in tokenizer.special_token_ids}
    assert limit - first > size // 2
    assert not special & set(range(first, limit))


def test_b_runs_torch_promote_types_under_torchax():
    """B serves GPT-2 through vLLM's PyTorch model under torchax, whose
    LayerNorm asks `torch.promote_types` (no torchax lowering in 0.0.13:
    B failed to start). ~2 s (torch and torchax imports)."""
    import torch
    import torchax

    from keras_vllm.bench import torchax_fixes

    torchax_fixes.answer_promote_types()
    with torchax.default_env():
        x = torch.ones(2, dtype=torch.bfloat16, device="jax")
        assert torch.promote_types(x.dtype, torch.float32) == torch.float32
        assert torch.promote_types(torch.int8, torch.uint8) == torch.int16


def test_cli_reaches_the_package(monkeypatch):
    from keras_vllm.cli import commands as cli
    from keras_vllm.bench import run

    seen = {}
    monkeypatch.setattr(
        run, "main", lambda argv: seen.setdefault("argv", argv) and 0
    )
    assert cli.main(["bench", "--quick", "--out", "x.json"]) == 0
    assert seen["argv"] == ["--quick", "--out", "x.json"]


def test_runs_outside_the_repository(tmp_path):
    # The installed package, not the checkout: from another directory, with
    # no repository path given, both commands reach the benchmark's parser.
    scripts = os.path.dirname(sys.executable)
    for command in (
        [sys.executable, "-m", "keras_vllm.bench", "--help"],
        [os.path.join(scripts, "keras-vllm"), "bench", "--help"],
    ):
        result = subprocess.run(
            command, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        assert "--model" in result.stdout and "--quick" in result.stdout


# Two fresh processes (~40 s of CI): the benchmark scripts' other tables
# run in the CI tier; this one in `-m matrix`.
@pytest.mark.matrix
def test_export_cost_table(capsys):
    from keras_vllm.bench import export_cost

    # Two of the five operations (each one a fresh process): the table,
    # the memory column and the ratio against the Keras call it replaces.
    operations = ["save_to_preset", "export_vllm_no_golden"]
    export_cost.main(
        ["--model", "tiny", "--reps", "1", "--operations", ",".join(operations)]
    )
    lines = capsys.readouterr().out.splitlines()
    rows = {
        cells[1].strip(): cells[2:5]
        for cells in (line.split("|") for line in lines)
        if len(cells) == 6 and cells[1].strip() in export_cost.OPERATIONS
    }
    assert sorted(rows) == sorted(operations)
    for name, (seconds, ratio, memory) in rows.items():
        assert float(seconds) > 0 and float(memory) >= 0, (name, seconds)
        assert ratio.strip().endswith("x") == (name != "save_to_preset"), ratio


def test_export_cost_refuses_a_load_without_its_export():
    from keras_vllm.bench import export_cost

    with pytest.raises(SystemExit):
        export_cost.main(["--operations", "load_causal_lm"])


@pytest.mark.serving
def test_kernel_table_times_every_block_setting():
    pytest.importorskip("tpu_inference")
    from keras_vllm.bench import kernel

    # Two of the steps, one repetition: `measure` itself checks that every
    # block setting gives the same outputs before it reports a time.
    steps = [kernel.STEPS[0], kernel.STEPS[-1]]
    rows = kernel.measure("tiny", reps=1, steps=steps)
    assert [row["step"] for row in rows] == [name for name, _ in steps]
    assert rows[-1]["tokens"] == 1  # the CPU's 1-token bucket
    text = kernel.table(rows)
    for label, _ in kernel.SETTINGS:
        assert label in text
    for row in rows:
        assert all(row[label] > 0 for label, _ in kernel.SETTINGS)


def test_moe_bench_shapes_and_best_of_rounds():
    """`bench.moe`'s models put most of a step's bytes in the experts, the
    dense comparison model has k experts' worth of intermediate, and each
    cell keeps its fastest round."""
    from keras_vllm.bench import moe

    hidden = moe.BASE["hidden_dim"]
    attention = 2 * hidden * hidden + 2 * hidden * hidden // 2  # q, o; k, v
    for experts, top_k in ((8, 2), (32, 4)):
        inner = moe.EXPERT_INTERMEDIATE[experts]
        expert_bytes = 4 * experts * 3 * hidden * inner
        assert expert_bytes > 150e6 and expert_bytes > 10 * 4 * attention
    best = moe._best([
        {"decode_c1_ms": 5.0, "prefill_tok_s": 100.0},
        {"decode_c1_ms": 4.0, "prefill_tok_s": 90.0},
    ])
    assert best == {"decode_c1_ms": 4.0, "prefill_tok_s": 100.0}


def test_hybrid_bench_compares_models_of_one_size():
    """`bench.hybrid`'s Qwen 3.5 and Qwen3 share depth, width, MLP and
    tied vocabulary, and their parameter counts are within 15% (tiny:
    2,898,520 and 2,624,256; Qwen 3.5's gated query doubles its
    full-attention query projection)."""
    from keras_vllm.bench import hybrid

    models = {f: hybrid.build("tiny", f) for f in hybrid.FAMILIES}
    backbones = {f: m.backbone for f, m in models.items()}
    for name in ("num_layers", "hidden_dim", "intermediate_dim",
                 "vocabulary_size"):
        values = {getattr(b, name) for b in backbones.values()}
        assert len(values) == 1, (name, values)
    counts = [b.count_params() for b in backbones.values()]
    assert max(counts) / min(counts) < 1.15, counts


def test_speculative_bench_acceptance_figures():
    """`bench.speculative`'s acceptance columns from vLLM's per-request
    histograms (index = drafts accepted in a verify step)."""
    from keras_vllm.bench import speculative

    # 10 verify steps drafting 4 each: 6 accepted all 4, 4 accepted none.
    cell = {"drafted": 40, "accepted": 24, "verify_steps": 10}
    assert speculative.acceptance(cell) == ("60%", "3.40")
    assert speculative.acceptance({"drafted": 0}) == ("no drafts", "-")
    # 3.4 tokens a verify step at 2x the plain rate: each step 1.7x as long.
    assert speculative.step_ratio({"decode_tok_s": 10.0},
                                   dict(cell, decode_tok_s=20.0)) == "1.70"
    draw = speculative._random_prompts(100)
    prompts = draw(3, 1)
    assert [len(p["prompt_token_ids"]) for p in prompts] == [
        speculative.PROMPT_TOKENS] * 3
    assert prompts == draw(3, 1)
    assert max(max(p["prompt_token_ids"]) for p in prompts) < 100


# ~10 s of CI (the tiny bench model built and decoded by Keras twice).
def test_the_cycling_workload_repeats_a_phrase_longer_than_a_token():
    """`bench.speculative`'s `cycling` model: Keras' greedy output goes
    round the prompt's last token's group of `CYCLE` ids (text repeating a
    5-token phrase, not one token), from any prompt."""
    import numpy as np

    from keras_vllm.bench import speculative
    from keras_vllm.hub import reference

    model = models.build("tiny", tie_word_embeddings=False)
    vocabulary = 200
    following = speculative.cycle_through(model, vocabulary)
    rng = np.random.default_rng(0)
    for _ in range(2):
        prompt = rng.integers(0, vocabulary, 12).tolist()
        new = reference.greedy_continuation(model, prompt, 12, [])
        expected, token = [], prompt[-1]
        for _ in range(12):
            token = int(following[token])
            expected.append(token)
        assert new == expected
        assert len(set(new)) == speculative.CYCLE
    with pytest.raises(ValueError, match="untied"):
        speculative.cycle_through(models.build("tiny"), vocabulary)


def test_speculation_aside_variants_and_table():
    from keras_vllm.bench import speculation_aside as aside

    variants = aside.variants(0.5, [[1, 4, 4], [5, 64, 0]])
    assert variants["plain"] == {}
    assert variants["n-gram, floor"]["additional_config"] == {
        "min_draft_acceptance": 0.5
    }
    assert variants["n-gram, schedule"]["speculative_config"][
        "num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 64, 0]]
    rows = aside.table("varied", {
        "plain": {1: (100.0, [[1, 2]]), 8: (400.0, [[3]])},
        "n-gram": {1: (150.0, [[1, 2]]), 8: (200.0, [[4]])},
    })
    assert rows[0].startswith("| workload | concurrency | plain tok/s")
    assert rows[2] == "| varied | 1 | 100 | 150 | 1.50 | yes |"
    assert rows[3] == "| varied | 8 | 400 | 200 | 0.50 | NO |"


def test_step_phases_keeps_decode_only_steps_and_derives_the_rest():
    """The per-phase table (`bench.step_phases`) takes its medians over the
    steps in which every request decodes, and derives "execute, rest" and
    "step, other" from the timed calls around them. No engine; <1 s."""
    from keras_vllm.bench import step_phases

    def step(decode_only, requests, scale):
        seconds = {
            "schedule": 1, "prepare inputs": 2, "model dispatch": 1,
            "logits dispatch": 1, "execute": 6, "sample + to host": 3,
            "update": 1, "outputs": 1, "step": 15,
        }
        return {"decode only": decode_only, "requests": requests,
                **{k: v * scale * 1e-3 for k, v in seconds.items()}}

    steps = [step(False, 2, 100.0), step(True, 2, 1.0), step(True, 2, 3.0),
             step(True, 2, 2.0), step(True, 1, 50.0)]
    rows = step_phases.phase_medians(steps, 2)
    assert rows["steps"] == 3
    assert rows["prepare inputs"] == pytest.approx(4.0)
    assert rows["execute, rest"] == pytest.approx(2 * (6 - 2 - 1 - 1))
    assert rows["step, other"] == pytest.approx(2 * (15 - 1 - 6 - 3 - 1 - 1))
    assert rows["step"] == pytest.approx(30.0)
    table = step_phases.table({2: rows})
    assert "model + head, device" not in table
    rows["model + head, device"] = 1.25
    table = step_phases.table({2: rows})
    assert "| model + head, device | 1.250 |" in table
    assert "| decode tok/s (tokens / step time) | 67 |" in table
    assert "| tokens per step | 2.0 |" in table
    with pytest.raises(RuntimeError, match="no decode-only step of 4"):
        step_phases.phase_medians(steps, 4)


def test_mixed_workload_and_static_batches():
    """`bench.mixed`: a seeded long-tailed workload, A's padded static
    batches giving each request its own tokens (equal to that request
    alone through `generate()`), and the table's rows. ~15 s (one
    `generate()` compile per batch width)."""
    from keras_vllm import testing
    from keras_vllm.bench import mixed

    workload = mixed.mixed_workload(64, 100, max_prompt=64, max_output=16)
    assert workload == mixed.mixed_workload(64, 100, 64, 16)
    assert workload != mixed.mixed_workload(64, 100, 64, 16, seed=1)
    prompts = [len(r["prompt"]) for r in workload]
    outputs = [r["max_tokens"] for r in workload]
    assert min(prompts) >= 4 and max(prompts) <= 64
    assert min(outputs) >= 1 and max(outputs) <= 16
    # Long-tailed: most requests well below the limits, some at them.
    assert sorted(prompts)[32] <= 16 and max(prompts) > 32
    assert len({tuple(r["prompt"]) for r in workload}) == 64

    causal_lm = testing.build_tiny_causal_lm("qwen")
    causal_lm.compile(sampler="greedy")
    small = workload[:6]
    result = mixed.measure_keras_mixed(causal_lm, small, batch_size=4)
    assert [len(i) for i in result["ids"]] == [r["max_tokens"] for r in small]
    assert result["tokens"] == result["requested_tokens"]
    alone = [mixed.keras_batch(causal_lm, [r])[0] for r in small]
    assert result["ids"] == alone

    engine = dict(result, tok_s=result["tok_s"] * 2, ids=list(result["ids"]))
    engine["ids"][0] = [t + 1 for t in engine["ids"][0]]
    rows = mixed.table({"A": {"mixed": result}, "B": None,
                        "C": {"mixed": engine}})
    assert rows[2].startswith("| A | 6 |")
    assert rows[3].startswith("| C | 6 |") and "| 5/6 | 2.00 |" in rows[3]
