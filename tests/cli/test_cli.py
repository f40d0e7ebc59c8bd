"""The `keras-vllm` command line, run as a user would (subprocesses)."""

import os
import subprocess
import sys
from unittest import mock

import pytest

from helpers.trained_models import trained
from keras_vllm import testing

CLI = [os.path.join(os.path.dirname(sys.executable), "keras-vllm")]


def _run(*args, timeout=600):
    return subprocess.run(
        CLI + list(args), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli") / "tiny_gpt2"
    testing.save_tiny_preset(trained("gpt2"), str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def exported(preset, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli_out") / "artifact"
    result = _run("export", preset, str(out), "--sampler", "greedy")
    assert result.returncode == 0, result.stderr
    # It says which weights it stored: none differ from the preset here.
    assert "weights  preset: 0 of " in result.stdout, result.stdout
    assert " variables, 0 B" in result.stdout
    return str(out)


def test_help_lists_every_command():
    result = _run("--help")
    assert result.returncode == 0
    for command in ("export", "inspect", "verify", "sign", "serve", "demo"):
        assert command in result.stdout


def test_bench_help_is_the_benchmark_scripts():
    result = _run("bench", "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--quick", "--systems", "--out"):
        assert option in result.stdout


@pytest.mark.parametrize(
    "argv, verbose, quiet",
    [
        (["-q", "inspect", "a"], False, True),
        (["inspect", "a", "-q"], False, True),
        (["inspect", "-v", "a"], True, False),
        (["inspect", "a"], False, False),
    ],
)
def test_output_options_before_or_after_the_command(argv, verbose, quiet):
    from keras_vllm.cli.commands import build_parser

    args, _ = build_parser().parse_known_args(argv)
    assert (args.verbose, args.quiet) == (verbose, quiet)


def test_usage_error_exit_code():
    assert _run("inspect").returncode == 2


@pytest.mark.parametrize(
    "variable, value",
    [
        ("KERAS_VLLM_VERBOSE", "maybe"),  # read as keras_vllm is imported
        ("KERAS_VLLM_DEVICE", "gpu"),  # read by the command
    ],
)
def test_malformed_variable_is_one_line_exit_3(variable, value, tmp_path):
    result = subprocess.run(
        CLI + ["inspect", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, variable: value},
    )
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(
        f"keras-vllm: ConfigurationError: {variable}={value!r} is not valid"
    ), result.stderr
    assert len(lines) == 1, result.stderr


def test_reload_refusal_exits_3():
    """A server that refuses the artifact (here a stand-in answering 409
    as `serve --enable-reload` does) is a refusal: exit 3, one line."""
    import http.server
    import json
    import threading

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's name)
            body = json.dumps({"error": "its tokenizer differs"}).encode()
            self.send_response(409)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        result = _run("reload", url, "/some/artifact")
    finally:
        server.shutdown()
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip() == (
        "keras-vllm reload: 409: its tokenizer differs"
    )


def test_demo_family_must_be_a_known_one(capsys):
    # The parser `keras-vllm` runs, in this process (a CLI process costs
    # ~30 s of imports here; test_usage_error_exit_code runs one).
    from keras_vllm.cli.commands import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo", "--family", "gemma"]).family == "gemma"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["demo", "--family", "llama4"])
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "invalid choice: 'llama4'" in stderr
    assert "gpt2" in stderr  # the families it accepts are listed


def test_inspect_summarizes(exported, preset):
    result = _run("inspect", exported)
    assert result.returncode == 0, result.stderr
    for text in ("GPT2", "preset", preset, "weights", "float32", "files"):
        assert text in result.stdout
    # Per-device bytes at TP = 1, 2, 4, 8: the tiny GPT-2's 4 heads split
    # over 1, 2 and 4 devices, not 8.
    rows = result.stdout.split("per device", 1)[1].splitlines()[1:5]
    assert [row.split()[0] for row in rows] == ["1", "2", "4", "8"]
    assert "refused: attention heads do not split over 8" in rows[3]


def test_inspect_counts_shared_kv_caches_once(tmp_path):
    """The KV cache table of the E2B-like Gemma 4 (layers sliding, sliding,
    full, twice; the last 2 read the caches of layers 3 and 2): 2 KV heads
    everywhere, head size 16 on sliding layers and 160 on full ones, laid
    out 128 and 256 wide. float32 keys and values per token: a sliding
    cache 2 * 2 * 128 * 4 = 2 KiB, a full one 4 KiB."""
    from keras_vllm import format as fmt
    from keras_vllm.serve.worker import capacity

    path = trained("gemma4_e2b").export_vllm(
        tmp_path / "gemma4_e2b", golden_prompts=[]
    )
    result = _run("inspect", "--no-verify", path)
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("KV cache ", 1)[1].split("per device")[0]
    rows = [line.split() for line in table.splitlines()[1:] if line.strip()]
    assert rows == [
        ["sliding_attention", "4", "3", "2", "x", "16", "(as", "128)",
         "6.0", "KiB"],
        ["full_attention", "2", "1", "2", "x", "160", "(as", "256)",
         "4.0", "KiB"],
        ["all", "6", "4", "10.0", "KiB", "(shared", "caches", "save", "6.0",
         "KiB:", "16.0", "KiB", "with", "one", "cache", "per", "layer)"],
    ]
    # The total is the TP=1 row of the per-device table.
    opened = fmt.open_artifact(path, verify=False)
    manifest, config = opened.manifest, opened.read_json(fmt.CONFIG_FILE)
    (_, _, kv_bytes), = capacity.per_device(
        capacity.abstract_backbone(manifest), config, "float32", (1,)
    )
    assert kv_bytes == 10 * 1024


def test_verify_passes_then_detects_corruption(exported, tmp_path):
    result = _run("verify", "-q", exported)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "checksums       ok (6 files)",
        "golden (keras)  ok",
    ]
    # Nothing from TensorFlow, libtpu or JAX's TPU probing with -q.
    for noise in ("absl::", "oneDNN", "cuInit", "TPU_WORKER_HOSTNAMES"):
        assert noise not in result.stderr, result.stderr
    # -q: results and errors only; keras-vllm's own notices stay quiet too.
    assert "no TPU found" not in result.stderr, result.stderr
    import shutil

    broken = str(tmp_path / "broken")
    shutil.copytree(exported, broken)
    with open(os.path.join(broken, "golden.json"), "a") as f:
        f.write(" ")
    result = _run("verify", broken)
    assert result.returncode == 3
    assert "golden.json" in result.stderr


def test_verify_of_a_sentencepiece_model_prints_no_cpp_lines(tmp_path):
    """tensorflow-text's SentencePiece prints `normalizer.cc(51) LOG(INFO)
    precompiled_charsmap is empty ...` from C++ as a model without a
    normalization table loads; verify's output has only its results."""
    path = testing.build_tiny_causal_lm("gemma").export_vllm(
        tmp_path / "gemma", golden_prompts=("The",), golden_max_new_tokens=2
    )
    result = _run("verify", path)
    assert result.returncode == 0, result.stderr
    assert "golden (keras)  ok" in result.stdout
    output = result.stdout + result.stderr
    assert "normalizer.cc" not in output and "LOG(INFO)" not in output, output


def test_export_refuses_existing_path(exported, preset):
    result = _run("export", preset, exported)
    assert result.returncode == 3
    assert "already exists" in result.stderr and "--overwrite" not in result.stdout


def test_export_of_a_directory_keras_hub_cannot_load_is_one_line(tmp_path):
    # A Hugging Face Llama directory without the tokenizer.json keras-hub's
    # converter reads.
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    result = _run("export", str(tmp_path), str(tmp_path / "out"))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("keras-vllm: ExportError: keras-hub could")
    assert "from_preset raised" in result.stderr
    assert not (tmp_path / "out").exists()


def test_serve_command_uses_artifact_defaults(exported):
    from keras_vllm.cli.serve import serve_command

    command = serve_command(exported, ["--port", "8123"])
    assert command[1:3] == ["serve", os.path.abspath(exported)]
    assert "--tokenizer-mode" in command and "keras_vllm" in command
    assert command[-2:] == ["--port", "8123"]


def test_relative_preset_export_verifies_anywhere_and_preset_overrides(
    preset, tmp_path
):
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(preset, work / "tiny")
    out = str(tmp_path / "delta")
    result = subprocess.run(
        CLI + ["export", "tiny", out, "--sampler", "greedy"],
        capture_output=True, text=True, timeout=600, cwd=work,
    )
    assert result.returncode == 0, result.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run(
        CLI + ["verify", out], capture_output=True, text=True, timeout=600,
        cwd=elsewhere,
    )
    assert result.returncode == 0, result.stderr
    # The serving host keeps its copy of the preset somewhere else.
    moved = str(tmp_path / "models" / "tiny")
    shutil.move(str(work / "tiny"), moved)
    result = _run("verify", out)
    assert result.returncode == 3
    assert "--preset" in result.stderr
    result = _run("verify", out, "--preset", moved)
    assert result.returncode == 0, result.stderr
    assert "golden (keras)  ok" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--preset", "/models/p", "art", "--port", "1"],
        ["serve", "art", "--preset", "/models/p", "--port", "1"],
        ["serve", "art", "--port", "1", "--preset=/models/p"],
    ],
)
def test_serve_takes_preset_before_or_after_the_artifact(argv):
    from keras_vllm.cli.serve import take_option
    from keras_vllm.cli.commands import build_parser

    args, _ = build_parser().parse_known_args(argv)
    preset = take_option(args.vllm_args, "--preset") or args.preset
    assert preset == "/models/p"
    assert args.vllm_args == ["--port", "1"]


# < 1 s of CI (the accelerator is stood in for).
def test_demo_compares_full_precision_matmuls_on_an_accelerator(monkeypatch):
    # A TPU's default float32 matmul takes bfloat16 passes: the demo's
    # token-for-token comparison drifted there (5 of 6 prompts equal on the
    # lent v5e) until both sides ran "highest". The demo sets the variable
    # itself, so the whole environment is restored afterwards.
    import jax

    from keras_vllm.cli import demo

    previous = jax.config.jax_default_matmul_precision
    with mock.patch.dict(os.environ):
        os.environ.pop("JAX_DEFAULT_MATMUL_PRECISION", None)
        assert demo._float32_matmuls_in_full() is None  # this CPU host
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
        try:
            assert demo._float32_matmuls_in_full() == "tpu"
            assert os.environ["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
            assert jax.config.jax_default_matmul_precision == "highest"
            # A precision the user chose is theirs.
            jax.config.update("jax_default_matmul_precision", previous)
            os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "default"
            assert demo._float32_matmuls_in_full() is None
            assert jax.config.jax_default_matmul_precision == previous
        finally:
            jax.config.update("jax_default_matmul_precision", previous)
