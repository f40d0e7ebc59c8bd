"""The tiny Gemma 4 and Gemma 3n fixtures build without TensorFlow.

keras-hub 0.32's `Gemma4CausalLMPreprocessor` and
`Gemma3nCausalLMPreprocessor` assert TensorFlow in their constructors, and
the TPU tier's host has none; there `build_tiny_causal_lm` gives these
families the generic `CausalLMPreprocessor`. A subprocess where TensorFlow
cannot be imported builds each fixture; it must tokenize and generate one
prompt exactly as this process's fixture (TensorFlow present: the family's
own preprocessor, the same seeded weights) does; rebuilding the family's
own preprocessor there (`load_causal_lm` of an artifact that records it) is
refused by name: TensorFlow is not installed, serving needs none.

Cost: ~22-24 s on 2 cores (~36 s with pytest's start): the subprocess
builds the three fixtures while this process builds them with TensorFlow,
one short `generate()` compile each.
"""

import inspect
import json
import os
import subprocess
import sys
import textwrap

from keras_vllm import testing
from keras_vllm.testing import configs

FAMILIES = ("gemma4", "gemma4_e2b", "gemma3n")
PROMPT = testing.prompts()[0]
MAX_LENGTH = 20


def _outputs(causal_lm, prompt, max_length):
    """What the fixture's preprocessing and `generate()` give for `prompt`,
    as JSON values (this function's source also runs in the subprocess)."""
    import hashlib

    import numpy as np

    preprocessor = causal_lm.preprocessor
    packed = preprocessor.generate_preprocess(
        [prompt], sequence_length=max_length
    )
    generated = {}
    postprocess = preprocessor.generate_postprocess

    def capture(x):
        # The token ids `generate()` produced, before detokenizing.
        generated.update({k: np.asarray(v).tolist() for k, v in x.items()})
        return postprocess(x)

    preprocessor.generate_postprocess = capture
    try:
        text = causal_lm.generate([prompt], max_length=max_length)
    finally:
        preprocessor.generate_postprocess = postprocess
    digest = hashlib.sha256()
    for weight in causal_lm.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return {
        "weights": digest.hexdigest(),
        "packed": {k: np.asarray(v).tolist() for k, v in packed.items()},
        "generated": generated,
        "text": [str(t) for t in text],
    }


# The subprocess: `tensorflow` and `tensorflow_text` stay None in
# `sys.modules` for its whole life, so every import of them fails (and
# `find_spec` finds none) as where TensorFlow is not installed. vLLM is kept
# out as in an export-only process (~20 s of imports this test does not need).
_SUBPROCESS = """
import json
import sys

sys.modules["tensorflow"] = None
sys.modules["tensorflow_text"] = None

from keras_vllm.hub import imports

imports.without_serving_stack()
import keras_hub

assert imports.imported_without_tensorflow()
from keras_vllm import testing
from keras_vllm.testing import configs

{source}

out = {{}}
for family in {families!r}:
    causal_lm = testing.build_tiny_causal_lm(family)
    own = getattr(
        keras_hub.models, configs.SPECS[family][0] + "CausalLMPreprocessor"
    )
    try:
        own(tokenizer=causal_lm.preprocessor.tokenizer)
        refused = None
    except ImportError as e:
        refused = str(e)
    # What `load_causal_lm` of an artifact that records the own class says
    # on such a host: the class rebuilt as from the manifest.
    from keras_vllm.errors import ArtifactError
    from keras_vllm.load import rebuild

    try:
        rebuild.construct(
            own, {{"tokenizer": causal_lm.preprocessor.tokenizer}},
            "preprocessor",
        )
        load_refused = None
    except ArtifactError as e:
        load_refused = str(e)
    out[family] = dict(
        _outputs(causal_lm, {prompt!r}, {max_length!r}),
        preprocessor=type(causal_lm.preprocessor).__name__,
        own_class_refused=refused,
        load_refused=load_refused,
    )
out["tensorflow_modules"] = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] in ("tensorflow", "tensorflow_text") and module
)
print(json.dumps(out))
"""


def test_fixtures_build_and_generate_the_same_without_tensorflow():
    code = _SUBPROCESS.format(
        source=textwrap.dedent(inspect.getsource(_outputs)),
        families=FAMILIES,
        prompt=PROMPT,
        max_length=MAX_LENGTH,
    )
    # Started first: it builds its fixtures while this process builds its.
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="jax", KERAS_NNX_ENABLED="true"),
    )
    try:
        expected, starts = {}, {}
        for family in FAMILIES:
            causal_lm = testing.build_tiny_causal_lm(family)
            # Where TensorFlow is available, the family's own class stays.
            assert type(causal_lm.preprocessor).__name__ == (
                configs.SPECS[family][0] + "CausalLMPreprocessor"
            )
            expected[family] = _outputs(causal_lm, PROMPT, MAX_LENGTH)
            starts[family] = causal_lm.preprocessor.tokenizer.start_token_id
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-4000:]
    found = json.loads(stdout.strip().splitlines()[-1])
    assert found.pop("tensorflow_modules") == []
    for family in FAMILIES:
        got = found[family]
        assert got.pop("preprocessor") == "CausalLMPreprocessor", family
        assert "requires `tensorflow`" in got.pop("own_class_refused"), family
        refusal = got.pop("load_refused") or ""
        assert "needs TensorFlow" in refusal, family
        assert "not installed here" in refusal and "needs none" in refusal
        # The same weights; the start token, prompt ids and padding; the
        # same generated ids and text.
        assert got["packed"]["token_ids"][0][0] == starts[family], family
        assert got == json.loads(json.dumps(expected[family])), family
