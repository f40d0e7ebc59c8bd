"""What each test file costs, and the order the suite runs in because of it.

A pytest plugin (`conftest.py` loads it):

- **Order.** Test files run longest first, by the seconds recorded in
  `tests/costs.json` (a file not listed there counts as
  `DEFAULT_SECONDS`). Under `pytest -n 2 --dist loadfile` each worker
  takes the next file when it is done (pytest-xdist's own reordering, by
  number of tests, is turned off), so the longest files start first and
  short ones fill the end: the two workers finish close together instead
  of one idling while the other runs the last long file.
- **Record.** `--record-costs=PATH` writes, per test file: its wall seconds
  on the worker that ran it, its tests, and what it spent on engines and
  servers it started, fine-tunes it ran and JAX compiles in the test
  process (engine processes compile on their own; their time is in the
  engine start and the checks). `python -m helpers.costs PATH` (from
  `tests/`) prints it as the table in docs/TESTING.md; `--write-order`
  also refreshes `tests/costs.json`.

Helpers report what they start with `record(kind, seconds)`.
"""

import contextlib
import json
import os
import pathlib
import sys
import time

TESTS = pathlib.Path(__file__).resolve().parent.parent
COSTS_FILE = TESTS / "costs.json"
# The cost of a file never measured: about a median file's.
DEFAULT_SECONDS = 30.0

# What a file spent, by kind: "engine", "server", "fine-tune", "compile".
KINDS = ("engine", "server", "fine-tune", "compile")

_current_file = None
_files = {}


def _file_of(nodeid):
    return nodeid.split("::")[0]


def _entry(path):
    return _files.setdefault(
        path,
        {"start": None, "end": None, "tests": 0}
        | {f"{k}_seconds": 0.0 for k in KINDS}
        | {f"{k}_count": 0 for k in KINDS},
    )


def record(kind, seconds):
    """Adds `seconds` of `kind` (one of `KINDS`) to the running test file."""
    if _current_file is None:
        return
    entry = _entry(_current_file)
    entry[f"{kind}_seconds"] += seconds
    entry[f"{kind}_count"] += 1


@contextlib.contextmanager
def timed(kind):
    """Records the time of the `with` block as one `kind`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record(kind, time.perf_counter() - start)


def recorded_order():
    """`{test file: seconds}` from `tests/costs.json` ({} when absent)."""
    try:
        with open(COSTS_FILE) as f:
            return {k: float(v) for k, v in json.load(f)["seconds"].items()}
    except (OSError, ValueError, KeyError):
        return {}


def pytest_addoption(parser):
    parser.addoption(
        "--record-costs",
        metavar="PATH",
        default=None,
        help="write each test file's cost (seconds, engines, fine-tunes, "
        "compiles) to PATH as JSON (see tests/helpers/costs.py)",
    )


def pytest_collection_modifyitems(session, config, items):
    costs = recorded_order()
    first = {}
    for index, item in enumerate(items):
        first.setdefault(_file_of(item.nodeid), index)
    items.sort(
        key=lambda item: (
            -costs.get(_file_of(item.nodeid), DEFAULT_SECONDS),
            first[_file_of(item.nodeid)],
        )
    )


def pytest_runtest_logstart(nodeid, location):
    global _current_file
    _current_file = _file_of(nodeid)
    entry = _entry(_current_file)
    if entry["start"] is None:
        entry["start"] = time.time()
    entry["tests"] += 1


def pytest_runtest_logfinish(nodeid, location):
    _entry(_file_of(nodeid))["end"] = time.time()


def pytest_configure(config):
    # pytest-xdist orders files by their number of tests unless told not
    # to; the order chosen here (longest first) is the one to keep.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if config.getoption("--record-costs", None) is None:
        return
    # JAX compiles in this process (the Keras references, fine-tunes,
    # exports' goldens): jax is imported by then, and its monitoring
    # events carry each backend compile's duration.
    from jax import monitoring

    def on_duration(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            record("compile", seconds)

    monitoring.register_event_duration_secs_listener(on_duration)


def _finished():
    return {
        path: dict(entry, wall_seconds=(entry["end"] or entry["start"])
                   - entry["start"])
        for path, entry in _files.items()
        if entry["start"] is not None
    }


def pytest_sessionfinish(session):
    config = session.config
    if config.getoption("--record-costs", None) is None:
        return
    if hasattr(config, "workeroutput"):  # an xdist worker: to the controller
        config.workeroutput["keras_vllm_costs"] = json.dumps(_finished())


def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", None) or {}
    if "keras_vllm_costs" in output:
        worker = output.get("workerid", "?")
        for path, entry in json.loads(output["keras_vllm_costs"]).items():
            _files[path] = dict(entry, worker=worker)


def pytest_unconfigure(config):
    path = config.getoption("--record-costs", None)
    if path is None:
        return
    files = {p: e for p, e in _files.items() if "wall_seconds" in e}
    if not files:  # not distributed: this process ran the tests
        files = _finished()
    with open(path, "w") as f:
        json.dump({"files": files}, f, indent=1, sort_keys=True)


def table(files):
    """Markdown rows, most expensive file first."""
    lines = [
        "| test file | seconds | tests | engines (s) | servers (s) "
        "| fine-tunes (s) | compiles in the test process (s) |",
        "|---|---:|---:|---|---|---|---|",
    ]

    def cell(entry, kind):
        count = entry[f"{kind}_count"]
        return f"{count} ({entry[f'{kind}_seconds']:.0f})" if count else ""

    for path, entry in sorted(
        files.items(), key=lambda item: -item[1]["wall_seconds"]
    ):
        lines.append(
            f"| `{path}` | {entry['wall_seconds']:.0f} | {entry['tests']} | "
            + " | ".join(cell(entry, k) for k in KINDS)
            + " |"
        )
    total = sum(e["wall_seconds"] for e in files.values())
    lines.append(f"| all {len(files)} files (sum over both workers) | "
                 f"{total:.0f} | {sum(e['tests'] for e in files.values())} "
                 "| | | | |")
    return "\n".join(lines)


def main(argv):
    """`python -m helpers.costs RECORDED.json [--write-order]`."""
    with open(argv[0]) as f:
        files = json.load(f)["files"]
    print(table(files))
    if "--write-order" in argv:
        seconds = {
            path: round(entry["wall_seconds"], 1)
            for path, entry in sorted(files.items())
        }
        with open(COSTS_FILE, "w") as f:
            json.dump({"seconds": seconds}, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
