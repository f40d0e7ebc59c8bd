"""The package's layout rules, checked on the source (README, "Layout").

- Layers: a module imports only its own layer or lower ones (`LAYERS`,
  bottom first), counting imports inside functions; no import circle.
- The Keras/format side never imports the serving stack: vLLM,
  tpu-inference and xgrammar are imported only where `SERVING_STACK_HOMES`
  says.
- Every replacement of an upstream function goes through
  `keras_vllm.patching` (one helper, one marker).
- No module over 400 lines; the top level holds ground-floor modules only.
- The dotted paths written as strings (entry points, the worker extension,
  the fork server's preload, the reload middleware, the tokenizer
  registration) import from a clean interpreter.
"""

import ast
import importlib.metadata
import pathlib
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "keras_vllm"

# Bottom first; a module may import its own layer or lower ones. A name is a
# module or package path below `keras_vllm`.
LAYERS = [
    "errors envs version patching kernels testing",
    "format logs progress cpu layers.common",
    "hub signing _env layers",
    "export load",
    "serve.hf_config",
    "serve.tokenizer serve.multimodal serve.worker",
    "serve.preflight serve.speculation serve.decode_steps serve.process",
    "serve.frontend",
    "serve.plugin",
    "serve serve.engine",
    "__init__",
    "bench",
    "cli",
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names.split()}

# Where vLLM / tpu-inference / xgrammar may be imported: the serving
# package, the CPU backend of tpu-inference, the paged attention that calls
# tpu-inference's kernel, and the benchmarks (they time vLLM's own calls).
# The CLI drives engines through `keras_vllm.serve` only.
SERVING_STACK = ("vllm", "tpu_inference", "xgrammar")
SERVING_STACK_HOMES = ("serve", "cpu", "layers.common", "bench")

TOP_LEVEL = {
    "__init__", "_env", "errors", "envs", "version", "logs", "progress",
    "patching",
}
MAX_LINES = 400


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        yield name, path


def _rank(module):
    parts = module.split(".")[1:] or ["__init__"]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in RANK:
            return RANK[key]
    return None


def _imports(path, module):
    """`(line, imported module or name)` of every import in `path`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def test_every_module_has_a_layer():
    missing = [m for m, _ in _modules() if _rank(m) is None]
    assert not missing, f"add these to LAYERS: {missing}"


def test_no_import_runs_upward():
    bad = []
    for module, path in _modules():
        for line, name in _imports(path, module):
            if not name.startswith("keras_vllm"):
                continue
            target = _rank(name)
            if target is not None and target > _rank(module):
                bad.append(f"{path.relative_to(REPO)}:{line} -> {name}")
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def _resolve(name, modules):
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_no_import_circle():
    modules = dict(_modules())
    graph = {
        module: {
            target
            for _, name in _imports(path, module)
            if name.startswith("keras_vllm")
            and (target := _resolve(name, modules)) not in (None, module)
            # A package's face re-exports its modules; importing a module
            # of a package runs its face first, which is not a circle.
            and not module.startswith(target + ".")
        }
        for module, path in modules.items()
    }
    state, circles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_serving_stack_imported_only_on_the_serving_side():
    bad = []
    for module, path in _modules():
        inner = module.removeprefix("keras_vllm.")
        if any(inner == h or inner.startswith(h + ".") for h in SERVING_STACK_HOMES):
            continue
        for line, name in _imports(path, module):
            if name.split(".")[0] in SERVING_STACK:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not bad, "\n".join(bad)


def _replacements_outside_patching(path):
    """Attribute assignments (and `setattr`) that install a function: a
    name defined by a `def` in the file, a lambda, or a
    classmethod/staticmethod/functools wrapper."""
    tree = ast.parse(path.read_text())
    defined = {
        n.name for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }

    def installs_function(value):
        if isinstance(value, ast.Lambda):
            return True
        if isinstance(value, ast.Name):
            return value.id in defined
        if isinstance(value, ast.Call):
            func = ast.unparse(value.func)
            return func in ("classmethod", "staticmethod") or func.startswith(
                "functools."
            )
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    # An object's own attributes are its business.
                    and ast.unparse(target.value) != "self"
                    and installs_function(node.value)
                ):
                    found.append((node.lineno, ast.unparse(target)))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
            if len(node.args) == 3 and installs_function(node.args[2]):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_upstream_functions_are_replaced_only_through_patching():
    bad = []
    for module, path in _modules():
        if module == "keras_vllm.patching":
            continue
        text = path.read_text()
        for marker in ("keras_vllm_original", "_keras_vllm_patch", "._keras_vllm ="):
            if marker in text:
                bad.append(f"{path.relative_to(REPO)}: old marker {marker!r}")
        for line, what in _replacements_outside_patching(path):
            bad.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not bad, (
        "replace upstream functions with keras_vllm.patching.replace():\n"
        + "\n".join(bad)
    )


def test_the_rule_sees_a_replacement_made_by_hand(tmp_path):
    path = tmp_path / "patch.py"
    path.write_text(
        "import vllm\n"
        "def quiet(*a):\n    pass\n"
        "vllm.LLM.generate = quiet\n"
        "setattr(vllm.LLM, 'chat', quiet)\n"
        "vllm.x = classmethod(quiet)\n"
    )
    assert [line for line, _ in _replacements_outside_patching(path)] == [4, 5, 6]


def test_modules_are_small_and_the_top_level_holds_ground_floor_modules():
    long = [
        f"{path.relative_to(REPO)}: {n} lines"
        for _, path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "\n".join(long)
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, f"modules to put in a package: {top - TOP_LEVEL}"


def test_serving_tests_carry_the_marker():
    """A test file outside tests/serve/ that needs vLLM says so with the
    `serving` marker (tests/serve/ has it by its folder)."""
    tests = REPO / "tests"
    bad = []
    for path in tests.rglob("test_*.py"):
        if path.relative_to(tests).parts[0] == "serve":
            continue
        text = path.read_text()
        needs = any(
            f'importorskip("{name}")' in text for name in SERVING_STACK
        )
        if needs and "mark.serving" not in text:
            bad.append(str(path.relative_to(REPO)))
    assert not bad, "add pytest.mark.serving to: " + ", ".join(bad)


def _string_paths():
    """Every dotted path keras-vllm writes as a string, as (what, path)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    paths = [("console script", v) for v in project["scripts"].values()]
    for group in project["entry-points"].values():
        paths += [("vllm entry point", v) for v in group.values()]
    return paths


def test_entry_points_match_the_installed_distribution():
    """The installed metadata says what pyproject.toml says (a stale
    editable install would load modules that no longer exist)."""
    installed = {
        ep.value
        for ep in importlib.metadata.distribution("keras-vllm").entry_points
    }
    assert {path for _, path in _string_paths()} <= installed


@pytest.mark.serving
def test_string_paths_import_from_a_clean_interpreter():
    pytest.importorskip("vllm")
    script = """
import importlib, sys
from keras_vllm.serve.frontend import reload
from keras_vllm.serve.process import start
from keras_vllm.serve.tokenizer import registration
from keras_vllm.serve.worker import extension

def load(path):
    module, _, attr = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), attr)

paths = sys.argv[1:] + [
    extension.WORKER_EXTENSION, reload.MIDDLEWARE,
    registration.MODULE + "." + registration.CLASS_NAME,
] + [name + ".__name__" for name in start.PRELOAD]
for path in paths:
    load(path)
    print("ok", path)
"""
    result = subprocess.run(
        [sys.executable, "-c", script, *[p for _, p in _string_paths()]],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ok ") >= 7, result.stdout
