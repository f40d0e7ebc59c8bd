"""The tiny llama fine-tuned further: new weights for the same model.

`trained("llama")` continued on other token sequences (the corpus'
sentences reversed), once per session: the weight-update tests serve the
trained model, then these weights.
"""

import types

from helpers.trained_models import trained
from helpers.trained_models import trained_copy
from keras_vllm import testing

_UPDATED = {}


def updated_llama():
    """A copy of `trained("llama")` fine-tuned 20 more steps (shared; do not
    change it)."""
    if "llama" not in _UPDATED:
        model = trained_copy("llama")
        texts = [" ".join(reversed(s.split())) for s in testing.corpus()]
        testing.fine_tune(model, steps=20, texts=texts)
        _UPDATED["llama"] = model
    return _UPDATED["llama"]


def export(causal_lm, directory):
    """Exports as the update tests serve: 256 positions, two goldens."""
    return causal_lm.export_vllm(
        directory, max_sequence_length=256, golden_prompts=testing.prompts()[:2]
    )


def exported_pair(root):
    """`(models, paths)`: the old and new llama and their exports under
    `root`, each a namespace with `old` and `new`."""
    models = types.SimpleNamespace(old=trained("llama"), new=updated_llama())
    paths = types.SimpleNamespace(
        old=export(models.old, root / "old"), new=export(models.new, root / "new")
    )
    return models, paths
