"""The served model, handed to the drafter that drafts for it.

tpu-inference 0.32's `Eagle3Proposer.load_model(target_state)`
(`spec_decode/jax/eagle3.py`) builds the drafter of `method: "mtp"`
through its model registry after the runner has loaded the target: the
drafter class gets vLLM's config only (`__init__`, then
`load_weights(rng)`). A keras-vllm assistant needs the served model: its
verified artifact (the config `check_fits` reads) and its token embedding
(the assistant's input embedding). Opening and building the target again
in the drafter hashed every target file a second time and built a second
host copy of the target.

`install()` replaces `Eagle3Proposer.load_model` (pinned in
`keras_vllm.patching.PINNED_VERSIONS`): while the original loads the
drafter, `served_target()` is the runner's model; then a drafter that
shares its target's weights (keras-vllm's assistant class) gets them with
`share_target_weights`. The drafter cannot hold the served arrays while it
loads: tpu-inference then jits it with its state donated
(`model_loader._get_nnx_model`), which frees every array it holds, so it
loads with its own copy and the copy is replaced (and freed) here.
Drafters of other models are loaded as before. Without the replacement
keras-vllm's drafter does not load: it refuses, naming this module.
"""

import contextlib
import contextvars

from keras_vllm import patching

_SERVED = contextvars.ContextVar("keras_vllm_served_target", default=None)


def served_target():
    """The runner's served model while tpu-inference loads its drafter
    (None elsewhere)."""
    return _SERVED.get()


@contextlib.contextmanager
def drafting_for(target):
    """`served_target()` is `target` within this scope."""
    token = _SERVED.set(target)
    try:
        yield
    finally:
        _SERVED.reset(token)


def share_target_weights(proposer):
    """Gives a keras-vllm drafter the served model's arrays.

    Called once the drafter is loaded, and again when the served weights
    are replaced (`weight_update.replace_weights`). The proposer's leaves
    (what its jitted steps take) are re-derived from its state.

    Args:
        proposer: the runner's drafter (any kind; those whose model has no
            `share_target_weights` are left alone).
    """
    import jax
    from flax import nnx

    share = getattr(getattr(proposer, "model", None), "share_target_weights",
                    None)
    if share is None:
        return
    share(proposer.runner.model)
    state = proposer.state
    proposer.state_leaves = (
        tuple(jax.tree_util.tree_leaves(state))
        if isinstance(state, nnx.State) else state
    )


def install():
    """Replaces tpu-inference's drafter loading (idempotent; keras-vllm's
    vLLM plugin calls it in every vLLM process)."""
    from tpu_inference.spec_decode.jax import eagle3

    patching.replace(eagle3.Eagle3Proposer, "load_model", _handing_over)


def _handing_over(original):

    def load_model(self, target_model):
        with drafting_for(self.runner.model):
            original(self, target_model)
        share_target_weights(self)

    return load_model
