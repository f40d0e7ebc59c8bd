"""Serving processes import keras-hub without TensorFlow.

A fresh process that serves (`from_export`, vLLM's processes through the
plugin, the engine fork server) imports keras-hub with TensorFlow hidden,
~4-5 s sooner. Its tokenizers must give exactly the ids and text they give
with TensorFlow, as in the process that fine-tuned and exported. (The
token-exact serving tests that start engines in fresh processes,
`test_cli_engine` and `test_vllm_serve`, run this way too.)
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np

from keras_vllm.hub import imports
from keras_vllm import testing

# Texts that take different routes through byte-level BPE and SentencePiece:
# accents, CJK, emoji, runs of spaces, newlines, digits, special tokens.
TEXTS = testing.prompts()[:3] + [
    "Crème brûlée, naïve café",
    "数据 and データ 🤖🚀",
    "  two  spaces\n\nand\ttabs  ",
    "3.14159 x 1e-10 = 42!?",
    "<|endoftext|> <s> </s> <bos> <eos>",
]


def _encode_decode(tokenizer):
    rows = []
    for text in TEXTS:
        ids = [int(i) for i in np.asarray(tokenizer(text)).reshape(-1)]
        rows.append([ids, str(tokenizer.detokenize(ids))])
    return rows


def _serving_process(code, **env):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **env),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tokenizers_match_those_with_tensorflow_which_stays_importable(tmp_path):
    # This process imported keras-hub with TensorFlow (conftest builds
    # models); each family's tokenizer is saved and reloaded in a process
    # that serves.
    assert not imports.imported_without_tensorflow()
    expected = {}
    for family in testing.FAMILIES:
        tokenizer = testing.build_tiny_tokenizer(family)
        os.makedirs(tmp_path / family)
        tokenizer.save_assets(str(tmp_path / family))
        config = keras.saving.serialize_keras_object(tokenizer)
        (tmp_path / family / "config.json").write_text(json.dumps(config))
        expected[family] = _encode_decode(tokenizer)
    found = _serving_process(
        f"""
        import json, sys
        import keras
        import numpy as np
        from keras_vllm.hub import imports
        keras_hub = imports.import_keras_hub()
        assert imports.imported_without_tensorflow()
        assert "tensorflow" not in sys.modules, "TensorFlow was imported"
        TEXTS = {TEXTS!r}
        {textwrap.indent(_source(_encode_decode), " " * 8).strip()}
        out = {{}}
        for family in {list(testing.FAMILIES)!r}:
            folder = {str(tmp_path)!r} + "/" + family
            with open(folder + "/config.json") as f:
                tokenizer = keras.saving.deserialize_keras_object(json.load(f))
            tokenizer.load_assets(folder)
            out[family] = _encode_decode(tokenizer)
        # A class that insists on TensorFlow is refused with the fix.
        from keras_vllm.errors import ArtifactError
        from keras_vllm.load import rebuild
        try:
            rebuild.construct(
                keras_hub.models.Gemma3CausalLMPreprocessor,
                {{"tokenizer": tokenizer}}, "preprocessor",
            )
        except ArtifactError as e:
            out["refusal"] = str(e)
        # The user's own code can still import TensorFlow afterwards.
        import tensorflow as tf
        out["tf"] = int(tf.constant(2) + 3)
        print(json.dumps(out))
        """
    )
    assert found.pop("tf") == 5
    assert "KERAS_VLLM_SERVING_TENSORFLOW=1" in found.pop("refusal")
    assert found == json.loads(json.dumps(expected))


def test_the_opt_out_keeps_keras_hubs_tensorflow():
    found = _serving_process(
        """
        import json, sys
        from keras_vllm.hub import imports
        imports.import_keras_hub()
        print(json.dumps([
            imports.imported_without_tensorflow(),
            "tensorflow" in sys.modules,
        ]))
        """,
        KERAS_VLLM_SERVING_TENSORFLOW="1",
    )
    assert found == [False, True]


def test_a_keras_hub_imported_with_tensorflow_is_left_as_is():
    import keras_hub

    assert imports.import_keras_hub() is keras_hub
    assert not imports.imported_without_tensorflow()
    assert "tensorflow" in sys.modules


def _source(function):
    import inspect

    return inspect.getsource(function)
