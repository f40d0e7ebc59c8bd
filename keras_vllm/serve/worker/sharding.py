"""Where each backbone variable lives on a tensor-parallel mesh.

Keras variables carry no partition metadata tpu-inference can read, so the
serving model places every variable itself, once, after the backbone is
built. The rules follow the Keras layer that owns a variable, never a model
family (tpu-inference's own JAX models shard the same way):

* an `EinsumDense` projecting into heads (`q`, `k`, `v`: the output has a
  heads axis the input lacks) is split over its heads, as is its bias; one
  projecting heads back out (the attention output) over its heads input;
* any other 2-D projection by its role around the model's hidden size:
  `hidden -> wider` (MLP up and gate) over its output columns, with its
  bias; `anything -> hidden` (MLP down, a flat attention output) over its
  input rows;
* `ReversibleEmbedding` (token embedding and output head) over the
  vocabulary, as is the backbone's token embedding table held by a plain
  `Embedding` (a decoder nested in its backbone: Gemma 3n's);
* rank-3 variables of other layers (mixture-of-experts weights,
  `[experts, in, out]`) like a 2-D projection, along the intermediate
  size (`hidden -> wider` over its columns, `-> hidden` over its rows),
  else over their experts;
* a quantized layer's scales and zero points (`kernel_scale`,
  `embeddings_zero`, ...) with their kernel, when the kernel is split
  along an output axis (heads of q/k/v, MLP columns, the vocabulary) and
  the scale has that axis; per-output scales of a kernel split along its
  reduced input stay whole, as do Keras' packed int4 kernels (their
  property unpacks, so no rule names them);
* everything else (norms, position embeddings, biases added after a
  row-split matmul, routers that do not divide) is replicated.

A dimension that does not divide by the mesh's axis size stays replicated,
so every placement is valid; the attention heads themselves are checked
before vLLM starts (`keras_vllm.load.tensor_parallel`). XLA partitions the
backbone's graph from these placements and inserts the reductions, so the
numbers are those of one device (up to float summation order). A paged
layer class may override the rule for its own variables with
`tensor_parallel_axes(variable) -> axis | None | NotImplemented`.
"""

import keras
from keras import layers

# Which mesh axis each role is split over, as tpu-inference names them.
HEADS = "heads"
MLP = "mlp"
VOCAB = "vocab"
EXPERTS = "experts"
ROLES = (HEADS, MLP, VOCAB, EXPERTS)


def _equation_parts(layer):
    inputs, output = layer.equation.split("->")
    left, kernel = inputs.split(",")
    return left, kernel, output


def _heads_letter(layer):
    """The kernel letter of the heads axis of a heads projection, or None."""
    left, kernel, output = _equation_parts(layer)
    if len(output) > len(left) and output[-2] in kernel:
        return output[-2]  # hidden -> [heads, head_dim]
    if len(left) > len(output) and left[-2] in kernel:
        return left[-2]  # [heads, head_dim] -> hidden
    return None


def _projection_axis(shape, hidden_dim):
    """(axis, role) of a 2-D `[in, out]` kernel, or None to replicate."""
    fan_in, fan_out = shape
    if fan_out == hidden_dim:
        return 0, "row"
    if fan_in == hidden_dim:
        return 1, "column"
    return None


def _splits_outputs(layer, axis):
    """Whether splitting `layer`'s kernel along `axis` splits its outputs."""
    if isinstance(layer, layers.EinsumDense):
        _, kernel, output = _equation_parts(layer)
        return kernel[axis] in output
    if isinstance(layer, layers.Dense):
        return axis == 1
    return isinstance(layer, _reversible_embedding())


def _quantization_rule(layer, variable, hidden_dim):
    """`(axis, role)` of a quantized layer's scale or zero point, None to
    replicate it, NotImplemented for its other variables."""
    name = variable.name
    if not name.endswith(("_scale", "_zero")):
        return NotImplemented
    owner = name.rsplit("_", 1)[0]  # kernel_scale -> kernel
    main = next((v for v in layer.variables if v.name == owner), None)
    rule = None if main is None else _rule(layer, main, hidden_dim)
    if rule is None or not _splits_outputs(layer, rule[0]):
        return None
    axis, role = rule
    matches = [i for i, size in enumerate(variable.shape) if size == main.shape[axis]]
    return (matches[0], role) if len(matches) == 1 else None


def _rule(layer, variable, hidden_dim):
    """`(axis, role)` a variable of `layer` is split along, or None."""
    rank = len(variable.shape)
    if getattr(layer, "quantization_mode", None):
        rule = _quantization_rule(layer, variable, hidden_dim)
        if rule is not NotImplemented:
            return rule
    if isinstance(layer, layers.EinsumDense):
        letter = _heads_letter(layer)
        _, kernel, output = _equation_parts(layer)
        if variable is _stored(layer, "kernel"):
            if letter is not None:
                return kernel.index(letter), HEADS
            if rank == 2:
                found = _projection_axis(variable.shape, hidden_dim)
                return None if found is None else (found[0], MLP)
            return None
        bias_axes = getattr(layer, "bias_axes", None) or ""
        if variable is getattr(layer, "bias", None) and len(bias_axes) == rank:
            if letter is not None and letter in bias_axes and letter in output:
                return bias_axes.index(letter), HEADS
            shape = _shape(layer, "kernel")
            if rank == 1 and letter is None and len(shape) == 2:
                found = _projection_axis(shape, hidden_dim)
                if found is not None and found[1] == "column":
                    return 0, MLP
        return None
    if isinstance(layer, layers.Dense):
        if variable is _stored(layer, "kernel"):
            found = _projection_axis(variable.shape, hidden_dim)
            return None if found is None else (found[0], MLP)
        if variable is getattr(layer, "bias", None):
            found = _projection_axis(_shape(layer, "kernel"), hidden_dim)
            if found is not None and found[1] == "column":
                return 0, MLP
        return None
    if isinstance(layer, _reversible_embedding()):
        if variable is _stored(layer, "embeddings"):
            return 0, VOCAB
        if variable is getattr(layer, "reverse_embeddings", None):
            return 1, VOCAB
        return None
    if isinstance(layer, layers.Embedding):
        return None
    if rank == 3:
        # `[experts, in, out]`: split like a dense MLP, along the
        # intermediate size, so every device holds a slice of every expert
        # and a token's routed expert is on each device (split over the
        # experts, a dynamically indexed expert was gathered across devices
        # each step: 28x the same-active dense step at TP=2,
        # docs/benchmarks.md). The experts axis when neither side is the
        # hidden size.
        found = _projection_axis(variable.shape[1:], hidden_dim)
        if found is not None:
            return found[0] + 1, MLP
        return 0, EXPERTS
    return None


# Quantization modes whose `kernel` / `embeddings` property unpacks.
_PACKED_MODES = ("int4", "gptq", "awq")


def _stored(layer, name):
    """The variable behind `layer`'s `name` property ("kernel" of a Dense /
    EinsumDense, "embeddings" of an Embedding) where the property returns
    that variable; None where it computes one.

    Keras unpacks packed 4-bit weights (int4, GPTQ, AWQ) and adds enabled
    LoRA factors on every read of the property: eager JAX work that, on a
    TPU host, failed on the values orbax restored to the host's CPU device
    inside the runner's mesh ("Received incompatible devices": an int4
    artifact on the chip). Such weights stay whole (replicated).
    """
    if getattr(layer, "quantization_mode", None) in _PACKED_MODES:
        return None
    if getattr(layer, "lora_enabled", False):
        return None
    return getattr(layer, "_" + name, None)


def _shape(layer, name):
    """The shape of `layer`'s `name` property, traced without computing it
    (the layer's values stand in as abstract arguments: an eager op on a
    concrete value would run even under `jax.eval_shape`)."""
    stored = _stored(layer, name)
    if stored is not None:
        return tuple(stored.shape)
    import jax

    variables = list(layer.variables)

    def read(values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return getattr(layer, name)

    values = [variable.value for variable in variables]
    return tuple(jax.eval_shape(read, values).shape)


def _reversible_embedding():
    """The token-embedding-and-output-head classes (Keras 3.15 has its own;
    older KerasHub layers subclass keras-hub's)."""
    from keras_hub.layers import ReversibleEmbedding

    core = getattr(layers, "ReversibleEmbedding", ReversibleEmbedding)
    return (core, ReversibleEmbedding)


def hidden_size(backbone):
    """The backbone's model width (the residual stream's size)."""
    width = getattr(backbone, "hidden_dim", None)
    if width:
        return int(width)
    return int(_shape(backbone.token_embedding, "embeddings")[-1])


def owned_variables(backbone):
    """`(layer, variable)` for every backbone variable, each once, with the
    layer that created it."""
    seen = set()
    for layer in backbone._flatten_layers(include_self=True, recursive=True):
        own = list(layer._trainable_variables) + list(
            layer._non_trainable_variables
        )
        for variable in own:
            if id(variable) not in seen:
                seen.add(id(variable))
                yield layer, variable


def variable_axes(backbone, axis_sizes):
    """The split axis of every backbone variable.

    Args:
        backbone: a built KerasHub backbone (paged layers swapped in or not).
        axis_sizes: `{role: devices}` for `HEADS`, `MLP`, `VOCAB`, `EXPERTS`.

    Returns:
        A dict `{variable.path: (axis, role) or None}`; None is replicated.
    """
    hidden_dim = hidden_size(backbone)
    embedding = getattr(backbone, "token_embedding", None)
    table = None if embedding is None else _stored(embedding, "embeddings")
    axes = {}
    for layer, variable in owned_variables(backbone):
        rule = NotImplemented
        if variable is table:
            rule = (0, VOCAB)
        override = getattr(layer, "tensor_parallel_axes", None)
        if override is not None:
            rule = override(variable)
            if rule is not None and rule is not NotImplemented:
                rule = (rule, HEADS)
        if rule is NotImplemented:
            rule = _rule(layer, variable, hidden_dim)
        if rule is not None:
            axis, role = rule
            if variable.shape[axis] % axis_sizes[role]:
                rule = None
        axes[variable.path] = rule
    return axes


def _partition_spec(rank, rule, axis_names):
    from jax.sharding import PartitionSpec

    spec = [None] * rank
    if rule is not None:
        axis, role = rule
        spec[axis] = axis_names[role]
    return PartitionSpec(*spec)


def mesh_axes(mesh):
    """`({role: mesh axis name}, {role: devices along it})` for `mesh`."""
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.utils import get_mesh_shape_product

    names = {
        HEADS: ShardingAxisName.ATTN_HEAD,
        MLP: ShardingAxisName.MLP_TENSOR,
        VOCAB: ShardingAxisName.VOCAB,
        EXPERTS: ShardingAxisName.EXPERT,
    }
    sizes = {
        role: get_mesh_shape_product(mesh, name) for role, name in names.items()
    }
    return names, sizes


def shard_backbone(backbone, mesh):
    """Places every backbone variable on `mesh` by the rules above.

    Uses tpu-inference's `general_device_put`, which under its multi-host
    (Ray) executor feeds each host only the shards it holds.

    Args:
        backbone: the built backbone.
        mesh: the runner's `jax.sharding.Mesh`.

    Returns:
        `{variable.path: (axis, role) or None}` as placed.
    """
    from jax.sharding import NamedSharding
    from tpu_inference.layers.common.utils import general_device_put

    names, sizes = mesh_axes(mesh)
    axes = variable_axes(backbone, sizes)
    for _, variable in owned_variables(backbone):
        rule = axes[variable.path]
        spec = _partition_spec(len(variable.shape), rule, names)
        value = variable.value
        value = general_device_put(value, NamedSharding(mesh, spec),
                                   source_mesh=_own_mesh(value))
        variable.assign(value)
    return axes


def _own_mesh(value):
    """A mesh of the devices `value` lies on.

    Under the multi-host backend `general_device_put` slices the value for
    this host's shards, and it does so inside the mesh it is given as the
    source: without one, a value on this host's device sliced inside the
    runner's mesh context (which spans every host) is refused by JAX
    ("incompatible devices for jitted computation").
    """
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.array(sorted(value.devices(),
                                             key=lambda d: d.id)),
                             ("source",))


def device_bytes(backbone):
    """Bytes of backbone variables held by each device, `{device: bytes}`."""
    held = {}
    for _, variable in owned_variables(backbone):
        value = keras.ops.convert_to_tensor(variable.value)
        for shard in value.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held
