"""Third-party start-up lines are stopped at their source (subprocesses),
and `KERAS_VLLM_VERBOSE=1` still shows them."""

import os
import subprocess
import sys

# Lines that TensorFlow, libtpu and Gloo print outside Python logging.
NOISE = (
    "absl::InitializeLog",
    "oneDNN custom operations",
    "cuInit",
    "TPU_WORKER_HOSTNAMES",
    "TPU_ACCELERATOR_TYPE",
    "[Gloo]",
)


def _run(code, verbose=False):
    env = dict(os.environ)
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL",
                 "TF_ENABLED_DEVICE_TYPES", "KERAS_VLLM_VERBOSE"):
        env.pop(name, None)
    if verbose:
        env["KERAS_VLLM_VERBOSE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _noise(text):
    return [line for line in text.splitlines() if any(n in line for n in NOISE)]


def test_importing_keras_hub_and_running_tensorflow_is_quiet():
    # A tokenizer's lookup table is TensorFlow's first op (device listing).
    code = (
        "import keras_vllm, keras_hub, tensorflow as tf;"
        "print(int(tf.constant(1)))"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _noise(result.stdout + result.stderr) == []


def test_jax_stays_on_cpu_devices_after_importing_keras_vllm():
    # JAX reads JAX_PLATFORMS once, when first imported: keras_vllm must set
    # it before anything it imports imports JAX (else JAX tries libtpu).
    code = (
        "import keras_vllm, sys; assert 'jax' not in sys.modules;"
        "from jax._src import config; print(config.jax_platforms.value)"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "cpu"


_GLOO = (
    "from keras_vllm import logs; logs.drop_gloo_connected_lines();"
    "import torch.distributed as dist, socket;"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1];"
    "s.close();"
    "print('before', flush=True);"
    "dist.init_process_group('gloo', rank=0, world_size=1,"
    " init_method=f'tcp://127.0.0.1:{port}');"
    "dist.new_group([0], backend='gloo'); print('after')"
)


def test_gloo_connected_lines_are_dropped_and_other_output_kept():
    result = _run(_GLOO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["before", "after"]
    assert _noise(result.stdout + result.stderr) == []


def test_verbose_shows_everything():
    result = _run(_GLOO, verbose=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("[Gloo] Rank 0 is connected") == 2
    result = _run("import keras_vllm, tensorflow", verbose=True)
    # TensorFlow's start-up lines reach the terminal. Which ones it prints
    # depends on the CPU (oneDNN's line only where oneDNN is on), but the
    # absl preamble comes first on every host.
    assert _noise(result.stderr), result.stderr[-3000:]
