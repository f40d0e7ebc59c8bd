"""The result document (schema `keras-vllm-bench/1`): assembled from the
workers' results, checked, written and printed as Markdown tables."""

import json
import os

from keras_vllm.bench import mixed

SCHEMA = "keras-vllm-bench/1"
SYSTEMS = ("A", "B", "C-seed", "C")
RATIOS = (("C/A", "C", "A"), ("C/B", "C", "B"), ("C/C-seed", "C", "C-seed"))


def assemble(config, systems, prepare_result=None, environment=None):
    """The result document: config, per-system results, the table."""
    table = []
    for cell in config["cells"]:
        key = (cell["prompt_len"], cell["concurrency"])
        row = {"prompt_len": key[0], "concurrency": key[1]}
        reference = None
        for name in SYSTEMS:
            found = _cell(systems.get(name), key)
            row[name] = found["tok_s"] if found else None
            if name == "A" and found:
                reference = found["ids"]
            if name != "A" and found and reference is not None:
                row[f"{name} match A"] = [
                    sum(a == b for a, b in zip(reference, found["ids"])),
                    len(found["ids"]),
                ]
        for label, num, den in RATIOS:
            row[label] = (row[num] / row[den]
                          if row[num] and row[den] else None)
        table.append(row)
    doc = {
        "schema": SCHEMA,
        "config": config,
        "environment": environment or {},
        "systems": systems,
        "table": table,
    }
    if prepare_result is not None:
        doc["model"] = prepare_result.get("model")
        doc["exports"] = prepare_result.get("exports")
        doc["lora"] = prepare_result.get("lora")
    return doc


def _cell(system, key):
    if not system or not system.get("ok", True):
        return None
    for cell in system.get("cells", []):
        if (cell["prompt_len"], cell["concurrency"]) == key:
            return cell
    return None


def check_results(doc):
    """Raises ValueError unless `doc` has the result schema's shape."""
    def need(mapping, keys, where):
        for key in keys:
            if key not in mapping:
                raise ValueError(f"{where}: missing {key!r}")

    need(doc, ("schema", "config", "environment", "systems", "table"),
         "result")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"schema {doc['schema']!r} != {SCHEMA!r}")
    need(doc["config"], ("cells", "max_tokens", "engine_mode", "model"),
         "config")
    for name, system in doc["systems"].items():
        if name not in SYSTEMS:
            raise ValueError(f"unknown system {name!r}")
        if not system.get("ok", True):
            continue
        need(system, ("cells", "steps"), name)
        for cell in system["cells"]:
            need(cell, ("prompt_len", "concurrency", "seconds", "tokens",
                        "tok_s", "reps", "ids"), f"{name} cell")
    if len(doc["table"]) != len(doc["config"]["cells"]):
        raise ValueError("table rows != cells")
    for row in doc["table"]:
        need(row, ("prompt_len", "concurrency") + SYSTEMS
             + tuple(r[0] for r in RATIOS), "table row")
    return True


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def format_report(doc):
    """Markdown tables of a result document."""
    lines = ["output tokens/s (higher is better)", ""]
    header = ["prompt", "conc"] + list(SYSTEMS) + [r[0] for r in RATIOS]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for row in doc["table"]:
        cells = [str(row["prompt_len"]), str(row["concurrency"])]
        cells += [_fmt(row[s], ".0f") for s in SYSTEMS]
        cells += [_fmt(row[r[0]], ".2f") for r in RATIOS]
        lines.append("| " + " | ".join(cells) + " |")
    agreement = []
    for name in SYSTEMS[1:]:
        pairs = [row.get(f"{name} match A") for row in doc["table"]]
        pairs = [p for p in pairs if p]
        if pairs:
            agreement.append(f"{name} {sum(p[0] for p in pairs)}/"
                             f"{sum(p[1] for p in pairs)}")
    if agreement:
        lines += ["", "greedy outputs identical to A (requests): "
                  + ", ".join(agreement)]
    systems = doc["systems"]
    lines += ["", "| system | start -> first token (s) "
              "| engine start / load (s) "
              "| decode step c=1 (ms) | decode step c=max (ms) |",
              "|---|---|---|---|---|"]
    for name in SYSTEMS:
        system = systems.get(name)
        if not system or not system.get("ok", True):
            status = "-" if not system else "failed: " + system["error"]
            lines.append(f"| {name} | {status} | | | |")
            continue
        startup = system.get("startup", {})
        steps = system.get("steps", {})
        keys = sorted(steps, key=int)
        first = steps[keys[0]]["step_ms"] if keys else None
        last = steps[keys[-1]]["step_ms"] if len(keys) > 1 else None
        first_token = startup.get("process_start_to_first_token_s")
        start = startup.get("engine_start_s", startup.get("load_s"))
        lines.append(
            f"| {name} | {_fmt(first_token, '.1f')} | {_fmt(start, '.1f')} "
            f"| {_fmt(first, '.1f')} | {_fmt(last, '.1f')} |"
        )
    rows = mixed.table(systems)
    if rows:
        requests = doc["config"].get("mixed")
        lines += ["", f"mixed workload ({requests} requests of long-tailed "
                  "prompt and output lengths, all at once; A: static "
                  "batches in arrival order, padded)", ""] + rows
    exports = doc.get("exports")
    if exports:
        lines += ["", "| export | seconds | MB |", "|---|---|---|"]
        for name, item in exports.items():
            lines.append(f"| {name} | {item['seconds']:.2f} | "
                         f"{item['bytes'] / 1e6:.2f} |")
    lora = doc.get("lora")
    if lora:
        lines += ["", f"LoRA (rank {lora['rank']}, {lora['steps']} steps) "
                  f"artifact: {lora['delta_bytes'] / 1e6:.2f} MB "
                  f"(weights={lora['weights_mode']}) vs full "
                  f"{lora['full_bytes'] / 1e6:.2f} MB"]
    return "\n".join(lines)


def write(path, doc):
    """Writes `doc` to `path` as JSON, atomically (a partial run's file is
    always whole)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)

