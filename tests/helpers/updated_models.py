"""The tiny llama fine-tuned further: new weights for the same model.

`trained("llama")` continued on other token sequences (the corpus'
sentences reversed), once per session: the weight-update tests serve the
trained model, then these weights.
"""

from helpers.trained_models import trained
from keras_vllm import testing

_UPDATED = {}


def updated_llama():
    """A copy of `trained("llama")` fine-tuned 20 more steps (shared; do not
    change it)."""
    if "llama" not in _UPDATED:
        model = testing.build_tiny_causal_lm("llama")
        model.set_weights(trained("llama").get_weights())
        texts = [" ".join(reversed(s.split())) for s in testing.corpus()]
        testing.fine_tune(model, steps=20, texts=texts)
        _UPDATED["llama"] = model
    return _UPDATED["llama"]
