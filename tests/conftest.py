"""Session-wide fixtures and settings; shared helpers live in `helpers/`.

The folders mirror the package (`tests/export/` tests `keras_vllm/export/`,
...). One marker says a test needs the serving extra (vllm-tpu +
tpu-inference): `serving`. Every test under `tests/serve/` has it; a test
elsewhere carries it itself (`pytestmark = pytest.mark.serving` or the
decorator). Without the extra, those tests are skipped here, in one place
(`pytest.importorskip` stays only as a guard for module-level imports).

Two tiers (docs/TESTING.md): README's test command runs every test but
those marked `matrix`, which repeat a check the CI tier already makes on
another family, size or mode (TP=4 beside TP=2, a second family per
quantization mode, ...); `pytest -m matrix` runs them, and any `-m`
expression chooses for itself. `test_ci_tier.py` fails when a served family
or a listed feature has no check left in the CI tier.
"""

import importlib.util
import os
import pathlib

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_NNX_ENABLED", "true")

import pytest  # noqa: E402

from keras_vllm.cpu import detect  # noqa: E402

# On CPU the suite compiles hundreds of small XLA programs (each engine's
# step shapes, each family's references and fine-tune), and LLVM's
# optimization passes are most of each compile: at level 0 a tiny model's
# `generate()` compiled in 3-5 s instead of 9-15 s, and ran no slower. The
# results are the same computation (logprobs within 2e-6: another
# summation order where LLVM vectorized). Set here, before any JAX backend
# starts, so the test processes and every engine and CLI process they
# start use it; a caller's own level is kept. Not on a TPU host.
_LEVEL = "--xla_backend_optimization_level"
if detect.is_cpu_host() and _LEVEL not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" {_LEVEL}=0"
    ).strip()

# Files run longest first; `--record-costs` measures them (helpers/costs.py).
pytest_plugins = ["helpers.costs"]

TESTS = pathlib.Path(__file__).parent
# Test folders whose every test needs the serving extra.
SERVING_FOLDERS = ("serve",)


def serving_stack_installed():
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("vllm", "tpu_inference")
    )


def in_ci_tier(item):
    # `tpu` tests need a chip held by one process (tests/tpu/conftest.py).
    return all(item.get_closest_marker(m) is None for m in ("matrix", "tpu"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        # A module may mark some of its parametrized cases `matrix` by rule
        # (`in_matrix(item)`), where the parameter is a fixture's.
        rule = getattr(getattr(item, "module", None), "in_matrix", None)
        if rule is not None and rule(item):
            item.add_marker(pytest.mark.matrix)
    if not config.option.markexpr:
        deselected = [item for item in items if not in_ci_tier(item)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if in_ci_tier(item)]
    for item in items:
        folder = pathlib.Path(item.path).relative_to(TESTS).parts[0]
        if folder in SERVING_FOLDERS:
            item.add_marker(pytest.mark.serving)
    if serving_stack_installed():
        return
    skip = pytest.mark.skip(
        reason='needs the serving extra: pip install "keras-vllm[serving]"'
    )
    for item in items:
        if item.get_closest_marker("serving") is not None:
            item.add_marker(skip)


def _session_dir(tmp_path_factory, worker_id, name):
    """A directory of this test run, shared by its pytest-xdist workers
    (their own temporary directories are below one run directory)."""
    if worker_id == "master":
        return tmp_path_factory.mktemp(name)
    path = tmp_path_factory.getbasetemp().parent / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory, worker_id):
    """One persistent XLA compile cache for the whole test run.

    Engines whose programs match (the same family and sizes, or the
    sampling and logits programs of families with equal vocabularies) load
    them instead of compiling them again, whichever worker compiled them
    first. Set in the environment, so that vLLM's spawned engine processes
    and the CLI subprocesses inherit it. JAX skips programs that compile in
    under a second by default, which on CPU is nearly all of an engine's.
    The test processes' own compiles (Keras references of models rebuilt
    from artifacts or presets, the same model's programs in both workers)
    use it too, from a second up: below that, eager ops would write
    thousands of entries for nothing. Concurrent readers and writers are
    safe: JAX recompiles (with a warning) an entry it cannot read. A cache
    directory set by the caller is kept.
    """
    import jax

    directory = os.environ.get("VLLM_XLA_CACHE_PATH") or str(
        _session_dir(tmp_path_factory, worker_id, "xla_cache")
    )
    jax.config.update("jax_compilation_cache_dir", directory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_XLA_CACHE_PATH", directory)
        # The same directory from the start of each engine process, so that
        # programs compiled before tpu-inference sets it are cached too.
        patch.setenv("JAX_COMPILATION_CACHE_DIR", directory)
        patch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        patch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
        yield directory


@pytest.fixture(scope="session", autouse=True)
def compile_on_demand():
    """Test engines compile only the shapes their requests use.

    tpu-inference precompiles every token and request bucket before an
    engine serves (`SKIP_JAX_PRECOMPILE` skips that; the same programs are
    then compiled when a step first needs them). Test engines send a few
    batches, so most buckets would be compiled for nothing: about 37 s of
    each engine start on these 2 cores. `test_cli_engine.py` keeps the
    product's warm-up (it starts engines as a user does).
    """
    with pytest.MonkeyPatch.context() as patch:
        if "SKIP_JAX_PRECOMPILE" not in os.environ:
            patch.setenv("SKIP_JAX_PRECOMPILE", "1")
        yield


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Frees the XLA programs a test module compiled in this process.

    Every program XLA's CPU backend compiles is JIT-linked into memory
    mappings of its own (about three per kernel), held as long as a JAX
    cache holds the program. A test worker compiles thousands (a family
    module: ~2,700), and at the kernel's limit of 65,530 mappings per
    process (`vm.max_map_count`) LLVM aborts the worker in the middle of a
    compile (seen in CI: "Fatal Python error: Aborted" in
    `backend_compile_and_load`, a third of the way through the suite).
    Clearing JAX's caches after each module returns the mappings (measured:
    3,464 back to 2,697 after a tiny model's `generate()`); a later module
    that needs a program again compiles it or reads it from the run's
    compile cache.
    """
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session", autouse=True)
def engine_costs():
    """Each engine start counts toward its test file's cost (`--record-costs`,
    helpers/costs.py)."""
    if not serving_stack_installed():
        yield
        return
    from helpers import costs
    from keras_vllm.serve.engine.engine import KerasVllmEngine

    start = KerasVllmEngine.from_export.__func__

    def from_export(cls, *args, **kwargs):
        with costs.timed("engine"):
            return start(cls, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KerasVllmEngine, "from_export", classmethod(from_export))
        yield


@pytest.fixture(scope="session", autouse=True)
def shared_fine_tunes(tmp_path_factory, worker_id):
    """pytest-xdist workers share one fine-tune per family configuration
    (`helpers.trained_models`); the directory is the session's, above each
    worker's own temporary directory. `KERAS_VLLM_TPU_FINE_TUNES=DIR`
    names a directory of fine-tunes made on another host instead
    (`helpers.tpu_tier`: on a TPU host, where a call's minutes are few,
    the feature modules then train only what DIR lacks)."""
    from helpers import trained_models

    if os.environ.get("KERAS_VLLM_TPU_FINE_TUNES"):
        from helpers import tpu_tier

        tpu_tier.use_carried_fine_tunes()
    elif worker_id != "master":
        root = tmp_path_factory.getbasetemp().parent
        trained_models.SHARED_DIR = str(root / "fine_tunes")
    yield


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="session")
def hf_checkpoint_root(tmp_path_factory):
    """The directory of the session's tiny Hugging Face checkpoints:
    `helpers.hf_checkpoints.cached_checkpoint(root, family)` writes each
    family once per worker, for every test module that converts one."""
    return tmp_path_factory.mktemp("hf_checkpoints")
