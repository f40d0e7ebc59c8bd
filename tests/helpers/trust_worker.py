"""A corpus worker: imports keras-vllm once and runs many hostile cases.

    python tests/helpers/trust_worker.py JOBS.json RESULTS.jsonl

`JOBS.json` is `{"cases": [{"name", "path", "base"}], "bases": {base:
path}, "timeout_s", "memory_bytes"}`. For each case every reader runs
(`keras`: `load_causal_lm`; `tokenizer`: vLLM's tokenizer adapter;
`inspect` and `verify`: the CLI commands, in process) under a per-reader
`SIGALRM` timeout, with the worker's address space capped by
`resource.setrlimit` once the imports are done. One JSON line per result
is appended (and flushed) to `RESULTS.jsonl`, after a `start` line per
case, so the parent can tell which case a dead worker was running.
"""

import contextlib
import io
import json
import os
import resource
import signal
import sys
import traceback

PROBES = ("Hello world!", "h\u00e9llo w\u00f6rld", "the quick brown fox")


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _reader_functions():
    import keras_vllm
    from keras_vllm.cli import commands as cli
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    def keras(path):
        keras_vllm.load_causal_lm(path, verbose=False)
        return None

    def tokenizer(path):
        t = KerasVllmTokenizer.from_pretrained(path)
        return [t.encode(p) for p in PROBES]

    def command(name):
        def run(path):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(
                io.StringIO()
            ):
                rc = cli.main([name, "-q", path])
            if rc == cli.EXIT_REFUSED:
                line = err.getvalue().strip().splitlines()[-1]
                kind, _, message = line.partition(": ")[2].partition(": ")
                raise _Refused(kind, message)
            return rc

        return run

    return {
        "keras": keras,
        "tokenizer": tokenizer,
        "inspect": command("inspect"),
        "verify": command("verify"),
    }


class _Refused(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _run(fn, path, timeout):
    from keras_vllm.errors import KerasVllmError

    signal.alarm(timeout)
    try:
        value = fn(path)
        return {"outcome": "loaded", "value": value}
    except _Refused as e:
        return {"outcome": "refused", "error": e.kind, "message": str(e)}
    except KerasVllmError as e:
        return {"outcome": "refused", "error": type(e).__name__, "message": str(e)}
    except _Timeout:
        return {"outcome": "timeout", "message": f"no answer within {timeout}s"}
    except BaseException as e:  # a raw error is a finding, not a crash
        return {
            "outcome": "raw",
            "error": type(e).__name__,
            "message": str(e)[:500],
            "trace": traceback.format_exc()[-2000:],
        }
    finally:
        signal.alarm(0)


def main(jobs_path, results_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    readers = _reader_functions()
    signal.signal(signal.SIGALRM, _on_alarm)
    with open(results_path, "a", buffering=1) as out:
        # What each base's readers give, to compare loads against.
        # The first load pays the imports (keras-hub, TensorFlow): no case
        # timeout for it.
        reference = {
            base: _run(readers["tokenizer"], path, 600)
            for base, path in jobs["bases"].items()
        }
        # Every reader once on a good artifact before the memory cap: lazy
        # imports (vLLM, orbax) and JAX's start-up reservations come first.
        for name in ("keras", "verify"):
            _run(readers[name], jobs["bases"]["delta"], 300)
        for base, result in reference.items():
            out.write(
                json.dumps(
                    {"event": "reference", "base": base,
                     "outcome": result["outcome"], "message": result.get("message")}
                )
                + "\n"
            )
        limit = jobs.get("memory_bytes")
        if limit:
            # After the imports and a first load: the cap bounds what a case
            # may add, not JAX's start-up reservations.
            with open("/proc/self/statm") as f:
                pages = int(f.read().split()[0])
            cap = pages * os.sysconf("SC_PAGE_SIZE") + limit
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        for job in jobs["cases"]:
            out.write(json.dumps({"name": job["name"], "event": "start"}) + "\n")
            for reader, fn in readers.items():
                result = _run(fn, job["path"], jobs["timeout_s"])
                if reader == "tokenizer" and result["outcome"] == "loaded":
                    result["identical"] = (
                        result["value"] == reference[job["base"]].get("value")
                    )
                result.pop("value", None)
                out.write(
                    json.dumps({"name": job["name"], "reader": reader, **result})
                    + "\n"
                )
        out.write(json.dumps({"event": "done"}) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1], sys.argv[2])
