"""`keras_vllm.format`: every open verifies afresh; nothing read is stale."""

import json
import os
import shutil

import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError

from helpers.trained_models import trained


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("format") / "artifact"
    return trained("gpt2").export_vllm(path, golden_prompts=["a", "b c"])


def _copy(path, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    return str(copy)


def _rewrite_in_place(path, old, new):
    """Same size, same inode, modification time restored: only the bytes
    tell (what the size/mtime/inode caches trusted)."""
    stat = os.stat(path)
    with open(path, "r+b") as f:
        data = f.read()
        assert len(old) == len(new) and old in data
        f.seek(0)
        f.write(data.replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (
        stat.st_size, stat.st_ino, stat.st_mtime_ns
    )


def test_each_open_verifies_again(exported, tmp_path):
    path = _copy(exported, tmp_path)
    first = fmt.open_artifact(path)
    first.validate()
    assert first.read_json(fmt.CONFIG_FILE) is first.read_json(fmt.CONFIG_FILE)
    assert fmt.open_artifact(path) is not first
    # Bytes rewritten after a verified open are caught by the next open.
    _rewrite_in_place(
        os.path.join(path, fmt.GOLDEN_FILE),
        b"max_new_tokens", b"max_new_tokenz",
    )
    with pytest.raises(keras_vllm.IntegrityError, match=fmt.GOLDEN_FILE):
        fmt.open_artifact(path)


def test_json_is_checked_as_it_is_read(exported, tmp_path):
    """The window between hashing and reading is closed for JSON files:
    what is parsed must hash to the manifest's digest."""
    path = _copy(exported, tmp_path)
    opened = fmt.open_artifact(path)
    _rewrite_in_place(
        os.path.join(path, fmt.GOLDEN_FILE),
        b"max_new_tokens", b"max_new_tokenz",
    )
    with pytest.raises(keras_vllm.IntegrityError, match=fmt.GOLDEN_FILE):
        opened.read_json(fmt.GOLDEN_FILE)


def test_a_file_changed_after_opening_is_verified_again(exported, tmp_path):
    path = _copy(exported, tmp_path)
    opened = fmt.open_artifact(path)
    weights = sorted(
        rel for rel in opened.manifest["files"] if rel.startswith("weights/d/")
    )[0]
    full = os.path.join(path, weights)
    with open(full, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(keras_vllm.IntegrityError, match=weights):
        fmt.open_artifact(path)


def test_partial_verification_hashes_the_rest_when_asked(exported, tmp_path):
    path = _copy(exported, tmp_path)
    golden = os.path.join(path, fmt.GOLDEN_FILE)
    fmt.open_artifact(path, only=(fmt.TOKENIZER_DIR + "/",))
    _rewrite_in_place(golden, b"max_new_tokens", b"max_new_tokenz")
    fmt.open_artifact(path, only=(fmt.TOKENIZER_DIR + "/",))
    with pytest.raises(keras_vllm.IntegrityError, match=fmt.GOLDEN_FILE):
        fmt.open_artifact(path)


def test_format_1_0_artifacts_still_load(exported, tmp_path):
    path = _copy(exported, tmp_path)
    manifest_path = os.path.join(path, fmt.MANIFEST_FILE)
    manifest = json.load(open(manifest_path))
    manifest["format_version"] = [1, 0]
    del manifest["golden_reference"]
    del manifest["prefix_caching"]  # 1.8
    fmt.write_json(manifest_path, manifest)
    opened = fmt.open_artifact(path).validate()
    assert "golden_reference" not in opened.manifest
    loaded = keras_vllm.load_causal_lm(path)
    from keras_vllm.load.keras_loader import check_golden

    assert check_golden(loaded, path) == []


def test_format_1_5_artifacts_serve_text(exported, tmp_path):
    path = _copy(exported, tmp_path)
    manifest_path = os.path.join(path, fmt.MANIFEST_FILE)
    manifest = json.load(open(manifest_path))
    assert manifest["modalities"] == {"served": ["text"], "unserved_inputs": []}
    manifest["format_version"] = [1, 5]
    del manifest["modalities"]
    del manifest["prefix_caching"]  # 1.8
    fmt.write_json(manifest_path, manifest)
    opened = fmt.open_artifact(path).validate()
    assert fmt.served_modalities(opened.manifest) == ["text"]
    assert fmt.unserved_inputs(opened.manifest) == []


def test_a_modality_this_reader_cannot_serve_is_refused(exported, tmp_path):
    path = _copy(exported, tmp_path)
    manifest_path = os.path.join(path, fmt.MANIFEST_FILE)
    manifest = json.load(open(manifest_path))
    # Audio is no modality of this format; images need `modalities.image`.
    for served in (["text", "audio"], ["text", "image"]):
        manifest["modalities"]["served"] = served
        fmt.write_json(manifest_path, manifest)
        with pytest.raises(keras_vllm.ArtifactError, match="modalities.served"):
            fmt.open_artifact(path)


def test_unknown_golden_reference_is_refused(exported, tmp_path):
    path = _copy(exported, tmp_path)
    manifest_path = os.path.join(path, fmt.MANIFEST_FILE)
    manifest = json.load(open(manifest_path))
    manifest["golden_reference"] = "beam"
    fmt.write_json(manifest_path, manifest)
    with pytest.raises(keras_vllm.ArtifactError, match="golden_reference"):
        fmt.open_artifact(path)


def test_format_imports_only_the_standard_library():
    """The format is read in vLLM's processes before JAX starts and on
    export-only installs: it imports nothing but the standard library,
    keras_vllm.errors, keras_vllm.envs (itself stdlib-only) and itself."""
    import ast
    import sys

    folder = os.path.dirname(fmt.__file__)
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(folder, name)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "keras_vllm":
                modules = [f"keras_vllm.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert (
                    top in sys.stdlib_module_names
                    or module.startswith(
                        ("keras_vllm.format", "keras_vllm.errors", "keras_vllm.envs")
                    )
                ), f"{name} imports {module}"


_COUNT_HASHES = """
import sys
from keras_vllm.format import checksums
from keras_vllm.format import files
from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
count = []
real = files.sha256_file
counted = lambda *a, **k: count.append(1) or real(*a, **k)
checksums.sha256_file = files.sha256_file = counted
try:
    fmt.open_artifact(sys.argv[1])
except Exception as e:
    print(type(e).__name__)
print(len(count))
"""


def _hashes_in_new_process(path, env):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _COUNT_HASHES, path],
        env=env, capture_output=True, text=True, check=True,
    )
    return done.stdout.split()


def test_a_child_process_hashes_what_its_parent_verified(exported, tmp_path):
    """No verification crosses a process boundary on file stats: an
    engine process hashes the files again, so bytes rewritten in place
    (size, inode and mtime kept) after the parent verified are refused."""
    path = _copy(exported, tmp_path)
    env = dict(os.environ)
    fmt.open_artifact(path).validate()
    hashed = int(_hashes_in_new_process(path, env)[-1])
    assert hashed == len(fmt.open_artifact(path).manifest["files"])
    _rewrite_in_place(
        os.path.join(path, fmt.GOLDEN_FILE),
        b"max_new_tokens", b"max_new_tokenz",
    )
    assert _hashes_in_new_process(path, env)[0] == "IntegrityError"


def test_weights_are_split_into_data_files_that_read_back(
    tmp_path, monkeypatch
):
    import numpy as np

    from keras_vllm.hub import checkpoint

    # 64 KiB files stand in for the 64 MiB ones of a real model: each array
    # of 96 KiB can't share a file with another, so several files are
    # written (and in parallel), and reading needs no option.
    monkeypatch.setattr(checkpoint, "_DATA_FILE_BYTES", 64 << 10)
    rng = np.random.default_rng(0)
    arrays = {
        f"layer_{i}/kernel": rng.standard_normal((96, 256)).astype("float32")
        for i in range(6)
    }
    directory = str(tmp_path / "weights")
    checkpoint.save_weights(directory, arrays)
    data = [
        os.path.join(root, name)
        for root, _, names in os.walk(directory)
        if os.path.basename(root) == "d"
        for name in names
    ]
    assert len(data) >= 3
    restored = checkpoint.restore_weights(
        directory, {p: (a.shape, a.dtype) for p, a in arrays.items()}
    )
    for path, array in arrays.items():
        np.testing.assert_array_equal(restored[path], array)


@pytest.mark.parametrize(
    "window, flag, accepted",
    [
        (0, False, True),  # transformers' Qwen2-MoE config, window off
        (0, True, False),
        (0, None, False),  # no flag: the window is on
        (False, False, False),
        (-1, False, False),
        (16, True, True),
    ],
)
def test_a_zero_window_is_accepted_only_while_it_is_off(window, flag, accepted):
    from keras_vllm.errors import ArtifactError
    from keras_vllm.format import configs

    config = {"hidden_dim": 8, "num_layers": 1, "sliding_window_size": window}
    if flag is not None:
        config["use_sliding_window_attention"] = flag
    if accepted:
        assert configs.estimate_parameters(config) > 0
    else:
        with pytest.raises(ArtifactError, match="sizes must be positive"):
            configs.estimate_parameters(config)


def test_files_hash_in_parallel_as_they_would_one_by_one(tmp_path):
    paths, sizes = [], [0, 1, 3 << 20, 5 << 20, 7]
    for i, size in enumerate(sizes):
        path = tmp_path / f"file{i}"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    seen = []
    digests = fmt.sha256_files(paths, on_bytes=seen.append)
    assert digests == [fmt.sha256_file(p) for p in paths]
    assert len(set(digests)) == len(paths)
    assert sum(seen) == sum(sizes)
    os.mkfifo(tmp_path / "pipe")  # hashing it would block forever
    with pytest.raises(ArtifactError, match="not a regular file"):
        fmt.sha256_files(paths + [str(tmp_path / "pipe")])


def test_zero_per_layer_input_sizes_mean_none():
    """Gemma 4 without per-layer embeddings writes
    `hidden_size_per_layer_input: 0`; Gemma 3n's sizes are positive; any
    other size of 0, or a negative one, is refused. Cost: <1 s."""
    from keras_vllm.errors import ArtifactError
    from keras_vllm.format import configs

    base = {"vocabulary_size": 64, "num_layers": 2, "hidden_dim": 8}
    gemma4 = dict(base, hidden_size_per_layer_input=0,
                  vocab_size_per_layer_input=0)
    gemma3n = dict(base, hidden_size_per_layer_input=4,
                   vocab_size_per_layer_input=64)
    assert configs.estimate_parameters(gemma4) < configs.estimate_parameters(
        gemma3n
    )
    for bad in (dict(base, hidden_size_per_layer_input=-1),
                dict(base, hidden_dim=0)):
        with pytest.raises(ArtifactError, match="positive"):
            configs.estimate_parameters(bad)
