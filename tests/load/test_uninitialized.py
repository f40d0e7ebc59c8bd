"""A full export's backbone is built without computing initial values.

Its variables get the stored weights as their first values
(`keras_vllm.load.uninitialized`); the family round trips in test_export
check the loaded models compute exactly what the exported ones did.
"""

import numpy as np
from keras.src.backend.common import global_state

from keras_vllm import testing
from keras_vllm.load import uninitialized


def _pending():
    return global_state.get_global_attribute("uninitialized_variables") or []


def _build(deferred):
    cls = testing.backbone_class("llama")
    config = testing.backbone_config("llama", vocabulary_size=64)
    with uninitialized.values_deferred(deferred):
        return cls(**config)


def _call(backbone):
    ids = np.asarray([[1, 5, 9, 17]], dtype="int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    return np.asarray(backbone(x))


def test_variables_take_the_given_values_as_their_first():
    reference = _build(deferred=False)
    backbone = _build(deferred=True)
    assert all(v._value is None for v in backbone.variables)
    values = [(v, np.asarray(r.value)) for v, r in
              zip(backbone.variables, reference.variables)]
    # The last one is left out: it is initialized by its initializer.
    uninitialized.assign_values(backbone, values[:-1])
    for (variable, value) in values[:-1]:
        np.testing.assert_array_equal(np.asarray(variable.value), value)
    last = backbone.variables[-1]
    assert last._value is not None
    assert tuple(np.asarray(last.value).shape) == tuple(last.shape)
    assert not any(v is p for v in backbone.variables for p in _pending())


def test_a_backbone_given_every_value_computes_as_the_original():
    reference = _build(deferred=False)
    backbone = _build(deferred=True)
    uninitialized.assign_values(
        backbone,
        [(v, np.asarray(r.value))
         for v, r in zip(backbone.variables, reference.variables)],
    )
    np.testing.assert_array_equal(_call(backbone), _call(reference))


def test_without_deferral_values_are_computed_at_once():
    backbone = _build(deferred=False)
    assert all(v._value is not None for v in backbone.variables)


def test_a_backbone_whose_load_failed_is_not_kept_alive_by_keras():
    backbone = _build(deferred=True)
    assert any(v is p for v in backbone.variables for p in _pending())
    uninitialized.forget(backbone)
    assert not any(v is p for v in backbone.variables for p in _pending())


def test_a_build_that_fails_leaves_no_variables_behind():
    cls = testing.backbone_class("llama")
    count = len(_pending())
    try:
        with uninitialized.values_deferred():
            cls(**testing.backbone_config("llama", vocabulary_size=64))
            raise ValueError("refused")
    except ValueError:
        pass
    assert len(_pending()) == count


def test_restored_weights_are_placed_mostly_without_a_copy(tmp_path):
    import jax

    from keras_vllm import format as fmt
    from keras_vllm.load.keras_loader import build_backbone

    path = testing.build_tiny_causal_lm("llama").export_vllm(
        tmp_path / "artifact", weights="full", golden_prompts=(), verbose=False
    )
    backbone = build_backbone(fmt.open_artifact(path))
    values = [variable.value for variable in backbone.variables]
    pointers = [value.unsafe_buffer_pointer() for value in values]
    # tpu-inference places a model by a jitted identity that donates its
    # state: XLA reuses each buffer it owns (for any output of its size)
    # and copies one that aliases host memory. Weights that reached their
    # variables through host views were all copied; orbax itself hands
    # over a few such buffers on CPU (those whose alignment allowed it).
    placed = jax.jit(lambda state: list(state), donate_argnums=0)(values)
    reused = set(pointers) & {v.unsafe_buffer_pointer() for v in placed}
    assert len(reused) >= len(values) // 4
