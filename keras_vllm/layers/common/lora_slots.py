"""Per-token LoRA from stacked adapter slots (many adapters, one engine).

vLLM serves many LoRA adapters over one base by giving each scheduled
token a slot: slot 0 is "no adapter", slots 1..max_loras hold one adapter
each. A slotted projection keeps the base kernel untouched and adds, for
each token, the LoRA update of the adapter in that token's slot, in Keras'
own factor layout (`EinsumDense.enable_lora` / `Dense.enable_lora`):

* `lora_slots_a`: `[slots] + kernel.shape[:-1] + [max_rank]` (one A per
  head of a 3-D attention kernel, as Keras keeps it),
* `lora_slots_b`: `[slots, max_rank, kernel.shape[-1]]`,
* `lora_slots_scale`: `[slots]`, each adapter's `alpha / rank`,
* `lora_slots_bias` (layers with a bias): `[slots] + bias.shape`, each
  adapter's change of the bias (Keras' `enable_lora` leaves a bias
  trainable, so fine-tuning a GPT-2 query moves it).

An adapter of rank `r < max_rank` fills the first `r` columns of A and
rows of B and leaves zeros, which add nothing: padding the rank is exact.
The shapes never change, so writing another adapter into a slot reuses
the compiled programs.

The update is `scale * (x . A) @ B` with the layer's own equation for
`x . A` (A has the kernel's layout with the rank as its output axis), so
it is `x . (scale * A @ B)`, Keras' delta, without forming a kernel per
token. All slots' `x . A` are computed at once (`rank * slots` columns, a
small fraction of the kernel's), a one-hot mask keeps each token's own
slot, and one contraction over slots and rank with the stacked B gives the
update (tpu-inference's `bgmv_jax` one-hot form): plain JAX ops, the same
on CPU and TPU.

This is generic: any `Dense` or `EinsumDense` whose kernel's last axis is
the output's last axis (every KerasHub query/value projection) can be
slotted; nothing here names a model family.
"""

import jax
import jax.numpy as jnp
import keras

from keras_vllm.errors import UnsupportedModelError
from keras_vllm.layers.common.context import current_context

# Variable names of the slots (excluded from the artifact's variable order,
# like Keras' own `lora_kernel_a` / `lora_kernel_b`).
SLOT_VARIABLES = (
    "lora_slots_a", "lora_slots_b", "lora_slots_scale", "lora_slots_bias",
)

_SLOTTED_CLASSES = {}


def _letters(layer):
    """`(input, kernel, output)` einsum letters of a projection."""
    if isinstance(layer, keras.layers.EinsumDense):
        inputs, output = layer.equation.split("->")
        left, kernel = inputs.split(",")
        return left, kernel, output
    # Dense: `x @ kernel` over the last axis.
    return "...i", "io", "...o"


def unsupported_reason(layer):
    """Why a layer cannot be slotted (None when it can)."""
    if not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        return f"it is a {type(layer).__name__}, not a Dense or EinsumDense"
    if getattr(layer, "quantization_mode", None) is not None:
        return "it is quantized"
    if getattr(layer, "lora_enabled", False):
        return "it has LoRA enabled already"
    activation = getattr(layer, "activation", None)
    if activation is not None and activation is not keras.activations.linear:
        return "it applies an activation after its projection"
    left, kernel, output = _letters(layer)
    if kernel[-1] != output[-1] or kernel[-1] in left:
        return (f"its kernel's last axis is not its output's last axis "
                f"('{getattr(layer, 'equation', '')}')")
    return None


def _with_slots(base_call):
    """The `call` of a slotted projection: the layer's own projection plus
    each token's adapter update (none outside a serving step)."""

    def call(self, inputs, *args, **kwargs):
        outputs = base_call(self, inputs, *args, **kwargs)
        context = current_context()
        slots = None if context is None else context.lora_slots
        if slots is None:
            return outputs
        delta = slot_update(self, inputs, slots)
        return outputs + delta.astype(outputs.dtype)

    return call


def slot_update(layer, inputs, slots):
    """The LoRA update of each token's slot.

    Args:
        layer: a slotted projection.
        inputs: its inputs; the first axis is the token axis (vLLM's `T`).
        slots: int32 `[T]`, each token's slot.

    Returns:
        An array of the layer's output shape.
    """
    a = layer.lora_slots_a.value
    b = layer.lora_slots_b.value
    scale = layer.lora_slots_scale.value
    count, rank = a.shape[0], a.shape[-1]
    # [slots, ..., r] -> [..., slots * r]: one projection for all slots.
    flat = jnp.moveaxis(a, 0, -2).reshape(a.shape[1:-1] + (count * rank,))
    left, kernel, output = _letters(layer)
    projected = jnp.einsum(f"{left},{kernel}->{output}", inputs, flat)
    projected = projected.reshape(projected.shape[:-1] + (count, rank))
    # Each token's slot, its scale folded in: [T, slots] -> [T, 1.., slots, 1].
    weights = jax.nn.one_hot(slots, count, dtype=projected.dtype) * scale.astype(
        projected.dtype
    )
    middle = projected.ndim - 3
    weights = weights.reshape((weights.shape[0],) + (1,) * middle + (count, 1))
    # Contracting slots and rank with B at once never gathers a `[T, r,
    # out]` B per token (large for long prefills).
    update = jnp.einsum("t...sr,sro->t...o", projected * weights, b)
    bias = getattr(layer, "lora_slots_bias", None)
    if bias is not None:
        # Each token's bias change, broadcast as Keras adds the bias.
        per_token = jnp.take(bias.value, slots, axis=0)
        filler = (1,) * (update.ndim - per_token.ndim)
        update = update + per_token.reshape(
            per_token.shape[:1] + filler + per_token.shape[1:]
        )
    return update


def _slotted_class(cls):
    # A direct subclass with no instance layout of its own: CPython lets a
    # built layer be re-classed to it (a mixin base in front would not be).
    if cls not in _SLOTTED_CLASSES:
        _SLOTTED_CLASSES[cls] = type(cls)(
            f"Slotted{cls.__name__}",
            (cls,),
            {"__slots__": (), "call": _with_slots(cls.call),
             "_has_lora_slots": True, "__module__": __name__},
        )
    return _SLOTTED_CLASSES[cls]


def install_slots(layer, max_loras, max_rank, dtype):
    """Gives a projection zeroed adapter slots and re-classes it in place.

    Args:
        layer: a built `Dense` or `EinsumDense`.
        max_loras: adapters served at once (slots 1..max_loras).
        max_rank: the largest adapter rank (vLLM's `max_lora_rank`).
        dtype: the served dtype.

    Raises:
        UnsupportedModelError: the layer cannot be slotted (why named).
    """
    reason = unsupported_reason(layer)
    if reason is not None:
        raise UnsupportedModelError(
            f"Cannot serve LoRA adapters on '{layer.path}': {reason}."
        )
    shape = tuple(layer.kernel.shape)
    count = max_loras + 1
    layer._tracker.unlock()
    try:
        # Not trainable and outside the artifact's variable order: serving
        # state only.
        slots = [
            ("lora_slots_a", (count,) + shape[:-1] + (max_rank,)),
            ("lora_slots_b", (count, max_rank, shape[-1])),
            ("lora_slots_scale", (count,)),
        ]
        if getattr(layer, "bias", None) is not None:
            slots.append(("lora_slots_bias", (count,) + tuple(layer.bias.shape)))
        for name, slot_shape in slots:
            setattr(layer, name, layer.add_weight(
                name=name, shape=slot_shape, initializer="zeros",
                dtype=dtype, trainable=False,
            ))
    finally:
        layer._tracker.lock()
    layer.__class__ = _slotted_class(type(layer))


def slotted_layers(backbone):
    """The backbone's slotted projections, in layer order."""
    return [
        layer for layer in backbone._flatten_layers(include_self=False)
        if getattr(layer, "_has_lora_slots", False)
    ]
