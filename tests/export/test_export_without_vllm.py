"""The export side needs no vLLM: it runs with vLLM made unimportable."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = ("vllm", "tpu_inference", "torch", "torchax")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked (export-only install)")
            return None

    sys.meta_path.insert(0, Block())

    import numpy as np
    import keras_vllm
    from keras_vllm import testing

    lm = testing.build_tiny_causal_lm("gpt2")
    testing.fine_tune(lm, steps=5)
    path = lm.export_vllm(sys.argv[1], golden_prompts=["the quick"])
    loaded = keras_vllm.load_causal_lm(path)
    x = {"token_ids": np.array([[3, 4, 5]]), "padding_mask": np.ones((1, 3))}
    assert np.array_equal(np.asarray(loaded(x)), np.asarray(lm(x)))
    assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), [
        m for m in sys.modules if m.split(".")[0] in BLOCKED
    ]
    print("EXPORT-ONLY OK")
    """
)


def test_export_and_keras_load_without_vllm(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "artifact")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "EXPORT-ONLY OK" in result.stdout, result.stderr[-3000:]
