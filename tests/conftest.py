"""Session-wide fixtures and settings; shared helpers live in `helpers/`."""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_NNX_ENABLED", "true")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")
