"""The trust-boundary corpus (`helpers/trust_cases.py`), run in workers.

Every case is refused by every reader that reads what it damages (the
Keras loader, vLLM's tokenizer adapter, `keras-vllm inspect` and
`keras-vllm verify`), with a keras-vllm error whose message matches the
case; a reader that does not read the damaged part refuses too or loads
exactly what the good artifact loads. Cases run in two worker processes
that import keras-vllm once (`helpers/trust_worker.py`), each case under a
timeout and the workers under a memory cap. Canary files stand at the
paths the cases point outside the artifact: a FIFO that blocks any reader
(a read shows as a timeout) and a file whose access time must stay
untouched, and no case may create the code-execution canary.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from keras_vllm import testing

from helpers import trust_cases

WORKERS = 2
CASE_TIMEOUT_S = 30
MEMORY_CAP_BYTES = 6 << 30
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _export(causal_lm, path, **kwargs):
    return str(
        causal_lm.export_vllm(
            path, golden_prompts=("The",), golden_max_new_tokens=4, **kwargs
        )
    )


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust_bases")
    llama = testing.build_tiny_causal_lm("llama")
    preset = str(root / "llama_preset")
    testing.save_tiny_preset(llama, preset)
    import keras_hub

    tuned = keras_hub.models.CausalLM.from_preset(preset)
    variable = tuned.backbone.weights[3]  # one fine-tuned kernel: a delta
    variable.assign(variable.numpy() + 1)
    spm_512 = root / "spm_512"
    spm_512.mkdir()
    testing.build_tiny_tokenizer("llama", 512).save_assets(str(spm_512))
    return {
        "spm": _export(llama, root / "spm", chat_template=CHAT_TEMPLATE),
        "bpe": _export(testing.build_tiny_causal_lm("gpt2"), root / "bpe"),
        "delta": _export(tuned, root / "delta"),
        "preset": preset,
        "spm_512": str(spm_512 / "vocabulary.spm"),
    }


def _atime_works(directory):
    probe = os.path.join(directory, "atime_probe")
    with open(probe, "w") as f:
        f.write("x")
    os.utime(probe, (0, os.stat(probe).st_mtime))
    with open(probe) as f:
        f.read()
    return os.stat(probe).st_atime != 0


@pytest.fixture(scope="module")
def corpus(bases, tmp_path_factory):
    root = tmp_path_factory.mktemp("trust_corpus")
    canaries = root / "_canaries"
    canaries.mkdir()
    ctx = {
        "canary_file": str(canaries / "canary.spm"),
        "canary_fifo": str(canaries / "canary.fifo"),
        "exec_canary": str(canaries / "executed"),
        "preset": bases["preset"],
        "spm_512": bases["spm_512"],
    }
    # Content that would change the tokenizer if it were ever read.
    shutil.copy(bases["spm_512"], ctx["canary_file"])
    os.mkfifo(ctx["canary_fifo"])
    jobs = []
    for case in trust_cases.CASES:
        path = root / case.name / "artifact"
        scratch = root / case.name / "outside"
        scratch.mkdir(parents=True)
        shutil.copytree(bases[case.base], path)
        case.mutate(str(path), {**ctx, "scratch": str(scratch)})
        jobs.append({"name": case.name, "path": str(path), "base": case.base})
    atime = _atime_works(str(canaries))
    os.utime(ctx["canary_file"], (0, os.stat(ctx["canary_file"]).st_mtime))
    started = time.monotonic()
    results = _run_workers(jobs, bases, root)
    elapsed = time.monotonic() - started
    return {
        "results": results,
        "ctx": ctx,
        "atime": atime,
        "elapsed": elapsed,
    }


def _run_workers(jobs, bases, root):
    """Runs the jobs in `WORKERS` processes; a worker that dies is replaced
    and its case at the time recorded as a crash."""
    worker = os.path.join(
        os.path.dirname(__file__), "..", "helpers", "trust_worker.py"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    shards = [jobs[i::WORKERS] for i in range(WORKERS)]
    results = {}
    pending = []
    for i, shard in enumerate(shards):
        pending.append((i, 0, shard))
    running = []

    def start(i, attempt, shard):
        jobs_path = root / f"jobs_{i}_{attempt}.json"
        out_path = root / f"results_{i}_{attempt}.jsonl"
        jobs_path.write_text(
            json.dumps(
                {
                    "cases": shard,
                    "bases": {k: bases[k] for k in ("spm", "bpe", "delta")},
                    "timeout_s": CASE_TIMEOUT_S,
                    "memory_bytes": MEMORY_CAP_BYTES,
                }
            )
        )
        proc = subprocess.Popen(
            [sys.executable, worker, str(jobs_path), str(out_path)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(root / f"stderr_{i}_{attempt}.txt", "w"),
        )
        running.append((i, attempt, shard, proc, out_path))

    for item in pending:
        start(*item)
    while running:
        i, attempt, shard, proc, out_path = running.pop(0)
        proc.wait(timeout=900)
        lines = [json.loads(l) for l in out_path.read_text().splitlines() if l]
        current = None
        for line in lines:
            if line.get("event") == "reference":
                assert line["outcome"] == "loaded", f"good {line['base']}: {line}"
            elif line.get("event") == "start":
                current = line["name"]
            elif "reader" in line:
                results.setdefault(line["name"], {})[line["reader"]] = line
        if not lines or lines[-1].get("event") != "done":
            # Died: the running case crashed it; the rest go to a new worker.
            names = [job["name"] for job in shard]
            if current is not None:
                for reader in trust_cases.READERS:
                    results.setdefault(current, {}).setdefault(
                        reader,
                        {"outcome": "crashed", "message": f"worker exit {proc.returncode}"},
                    )
            done = names.index(current) + 1 if current in names else 0
            if done < len(shard) and attempt < 5:
                start(i, attempt + 1, shard[done:])
    return results


CASE_NAMES = [case.name for case in trust_cases.CASES]


def test_corpus_size_and_time(corpus):
    assert len(CASE_NAMES) >= 100
    assert len(set(CASE_NAMES)) == len(CASE_NAMES)
    classes = {c.klass for c in trust_cases.CASES}
    assert classes == {"outside", "integrity", "bounds", "exec"}
    print(f"{len(CASE_NAMES)} cases in {corpus['elapsed']:.0f}s")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_refused(name, corpus):
    case = next(c for c in trust_cases.CASES if c.name == name)
    results = corpus["results"].get(name, {})
    for reader in trust_cases.READERS:
        result = results.get(reader)
        assert result is not None, f"{name}/{reader}: no result"
        outcome = result["outcome"]
        if outcome == "loaded" and reader in case.may_load:
            if reader == "tokenizer":
                assert result["identical"], f"{name}: another tokenizer loaded"
            continue
        assert outcome == "refused", f"{name}/{reader}: {result}"
        assert re.search(case.message, result["message"]), (
            f"{name}/{reader}: {result['error']}: {result['message']!r} "
            f"!~ {case.message!r}"
        )


def test_no_canary_was_read_or_created(corpus):
    ctx = corpus["ctx"]
    assert not os.path.exists(ctx["exec_canary"])
    if corpus["atime"]:
        assert os.stat(ctx["canary_file"]).st_atime == 0, "a case read the canary"
    # Nothing replaced the FIFO canary (a reader writing to it would block).
    import stat

    assert stat.S_ISFIFO(os.lstat(ctx["canary_fifo"]).st_mode)
