"""Session-wide fixtures and settings; shared helpers live in `helpers/`.

The folders mirror the package (`tests/export/` tests `keras_vllm/export/`,
...). One marker says a test needs the serving extra (vllm-tpu +
tpu-inference): `serving`. Every test under `tests/serve/` has it; a test
elsewhere carries it itself (`pytestmark = pytest.mark.serving` or the
decorator). Without the extra, those tests are skipped here, in one place
(`pytest.importorskip` stays only as a guard for module-level imports).
"""

import importlib.util
import os
import pathlib

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_NNX_ENABLED", "true")

import pytest  # noqa: E402

TESTS = pathlib.Path(__file__).parent
# Test folders whose every test needs the serving extra.
SERVING_FOLDERS = ("serve",)


def serving_stack_installed():
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("vllm", "tpu_inference")
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
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


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """One persistent XLA compile cache for every engine of the session.

    Engines whose programs match (the same family and sizes, or the
    sampling and logits programs of families with equal vocabularies) load
    them instead of compiling them again. Set in the environment, so that
    vLLM's spawned engine processes and the CLI subprocesses inherit it. JAX
    skips programs that compile in under a second by default, which on CPU
    is nearly all of them. A cache directory set by the caller is kept.
    """
    directory = os.environ.get("VLLM_XLA_CACHE_PATH") or str(
        tmp_path_factory.mktemp("xla_cache")
    )
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


@pytest.fixture(scope="session", autouse=True)
def shared_fine_tunes(tmp_path_factory, worker_id):
    """pytest-xdist workers share one fine-tune per family configuration
    (`helpers.trained_models`); the directory is the session's, above each
    worker's own temporary directory."""
    from helpers import trained_models

    if worker_id != "master":
        root = tmp_path_factory.getbasetemp().parent
        trained_models.SHARED_DIR = str(root / "fine_tunes")
    yield


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")
