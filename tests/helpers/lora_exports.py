"""The LoRA adapter exports test_lora_adapters.py and
test_lora_factor_dtype.py share: one tiny Llama base (exported full) and
two LoRA adapters of it, each trained a few steps on other sentences, so
their greedy outputs differ. The support adapter stores its factors as
Keras trains them (float32, exact), the legal one in bfloat16
(`lora_dtype=`: half the bytes, rounded). Exported once per process.
"""

import json
import os
import shutil

import numpy as np
import pytest

from keras_vllm import format as fmt
from keras_vllm.hub import reference
from keras_vllm import testing
from keras_vllm.hub import checkpoint

from helpers.trained_models import lora_fine_tune
from helpers.trained_models import trained
from helpers.trained_models import trained_copy

RANK = 2
NEW_TOKENS = 8
GOLDEN = {"golden_prompts": testing.prompts()[:2],
          "golden_max_new_tokens": NEW_TOKENS}
# One golden prompt where no test reads more (each costs a compile).
ONE_GOLDEN = {"golden_prompts": testing.prompts()[:1],
              "golden_max_new_tokens": NEW_TOKENS}
# Each adapter learns to repeat other token ids, so their outputs differ.
TEXTS = {
    "support": ["alpha beta gamma alpha beta gamma alpha beta gamma."] * 4,
    "legal": ["water is wet water is wet water is wet water is wet."] * 4,
}
LORA_DTYPES = {"support": None, "legal": "bfloat16"}


def adapter_model(texts, steps=8):
    if steps == 8:
        # The fine-tune test_multi_adapter.py serves too (shared).
        return lora_fine_tune("llama", texts, rank=RANK)
    model = trained_copy("llama")
    model.backbone.enable_lora(RANK)
    testing.fine_tune(model, steps=steps, texts=texts, learning_rate=5e-2)
    return model


def factors(model):
    """`{layer path: (A, B)}`: copies of a LoRA model's factors."""
    return {
        layer.path: (np.array(layer.lora_kernel_a.numpy()),
                     np.array(layer.lora_kernel_b.numpy()))
        for layer in model.backbone._flatten_layers()
        if getattr(layer, "lora_enabled", False)
    }


def rounded(value, dtype="bfloat16"):
    return value.astype(checkpoint.dtype_of(dtype)).astype(np.float32)


_EXPORTS = {}


def exports(tmp_path_factory):
    """The shared exports, a dict: `root`, `base` (the full base), `models`
    and `paths` (per adapter name), `full` (the support model exported
    full), `exact` (each adapter model's factors just before its export)
    and `at_golden` (its factors while its golden outputs were recorded)."""
    if _EXPORTS:
        return _EXPORTS
    root = tmp_path_factory.mktemp("lora")
    base = trained("llama").export_vllm(
        root / "base", weights="full", **ONE_GOLDEN
    )
    models, paths, exact, at_golden = {}, {}, {}, {}
    record = reference.greedy_batch
    for name, texts in TEXTS.items():
        models[name] = adapter_model(texts)
        exact[name] = factors(models[name])

        def spy(causal_lm, *args, name=name):
            # The factors the golden outputs are recorded with (the export
            # records them with `reference.greedy_batch`).
            at_golden[name] = factors(causal_lm)
            return record(causal_lm, *args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reference, "greedy_batch", spy)
            paths[name] = models[name].export_vllm(
                root / name, base=base, max_sequence_length=256,
                lora_dtype=LORA_DTYPES[name], **GOLDEN
            )
    full = models["support"].export_vllm(
        root / "support_full", weights="full", **ONE_GOLDEN
    )
    _EXPORTS.update(root=root, base=base, models=models, paths=paths,
                    full=full, exact=exact, at_golden=at_golden)
    return _EXPORTS


def golden(path):
    with open(os.path.join(path, fmt.GOLDEN_FILE)) as f:
        return [r["output_ids"] for r in json.load(f)["outputs"]]


def edited_copy(exports, tmp_path, edit, name="support"):
    path = tmp_path / name
    shutil.copytree(exports["paths"][name], path)
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    base = os.path.join(os.path.dirname(exports["paths"][name]), "base")
    return path, base
