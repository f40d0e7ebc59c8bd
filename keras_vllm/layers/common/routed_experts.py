"""Mixture-of-experts blocks served at top-k cost: the routed-experts mixin.

A family's layer module subclasses its KerasHub sparse-MoE block with this
mixin (`class RoutedX(XSparseMoeBlock, RoutedExperts)`, registered with
`registry.register_paged` like the attention subclasses), so the served
model re-classes each block in place and keeps its variables. The subclass
declares, once, what differs between families:

- `route(tokens)`: the router, exactly as the KerasHub block computes it
  (`softmax_top_k` is the usual softmax, top-k, optionally renormalised);
- `expert_kernels()`: the experts' input kernels (`[E, hidden, ...]`,
  one or two) and output kernel (`[E, intermediate, hidden]`);
- `expert_biases()`: per-expert biases added to those projections
  (`[E, ...]`, or None where a kernel has none), or None for no biases;
- `expert_hidden(*projected)`: the expert's activation of the projected
  rows (SwiGLU and its precision);
- `shared_expert_output(tokens)`: an always-on expert added to the routed
  output (e.g. sigmoid-gated), or None. (Not `shared_expert`: KerasHub's
  Qwen 3.5 MoE block names its shared-expert sublayer so, and an instance
  attribute would hide the hook.)

The generic `call` then computes only the chosen experts for each token
(`keras_vllm.layers.common.expert_groups`), weights them with the router's top-k
weights and adds the shared expert. Ties in the router's top-k are decided
by the same `ops.top_k` the KerasHub block calls (`jax.lax.top_k`: the
lower expert index first), so the routed experts are the block's own. The
result equals the block's up to float summation order.

`KERAS_VLLM_MOE_EXPERTS=dense` serves the KerasHub block as it is (every
expert for every token), for comparison (`keras_vllm.bench.moe`). The
Keras-side model (`load_causal_lm`, `generate()`) is never re-classed.
"""

import jax.numpy as jnp
from keras import ops

from keras_vllm import envs
from keras_vllm.layers.common import expert_groups
from keras_vllm.layers.common.context import current_context


def softmax_top_k(router_logits, top_k, renormalize):
    """The usual router: softmax over experts, the top `top_k`.

    Computed with the same ops, in the same order, as KerasHub's Mixtral and
    Qwen MoE blocks, so ties resolve as there.

    Args:
        router_logits: `[T, E]`.
        top_k: experts per token.
        renormalize: whether the top-k probabilities are divided by their
            sum.

    Returns:
        `(weights [T, k], experts [T, k])`.

    Example:

    ```python
    weights, experts = softmax_top_k(logits, 2, renormalize=True)
    ```
    """
    probs = ops.softmax(router_logits, axis=-1)
    weights, experts = ops.top_k(probs, k=top_k)
    if renormalize:
        weights = weights / ops.sum(weights, axis=-1, keepdims=True)
    return weights, experts


def routed_moe_enabled():
    """Whether served MoE blocks compute only their routed experts."""
    return envs.MOE_EXPERTS.get() == "routed"


class RoutedExperts:
    """Mixin of the served subclasses of KerasHub sparse-MoE blocks.

    The subclass lists the KerasHub block first (CPython refuses to
    re-class an instance otherwise), sets `call = RoutedExperts.call` and
    implements the hooks in the module docstring.
    """

    # No slots of its own: re-classing keeps the object layout.
    __slots__ = ()
    _is_paged_layer = True
    _owns_kv_cache = False

    def route(self, tokens):
        """`(router_logits [T, E], weights [T, k], experts [T, k])`."""
        raise NotImplementedError

    def expert_kernels(self):
        """`(input_kernels, output_kernel)`: a tuple of `[E, H, ...]`
        variables and one `[E, I, H]` variable."""
        raise NotImplementedError

    def expert_biases(self):
        """`(input_biases, output_bias)` matching `expert_kernels()`: each
        an `[E, ...]` variable added to that kernel's product, or None
        where it has no bias; or None when no kernel has one."""
        return None

    def expert_hidden(self, *projected):
        """The expert's intermediate activation of its projected rows."""
        raise NotImplementedError

    def shared_expert_output(self, tokens):
        """An always-on expert's output `[T, H]`, or None."""
        return None

    def _keras_block(self):
        return type(self).__bases__[0]

    def call(self, hidden_states, attention_mask=None, training=None):
        if not routed_moe_enabled():
            # Only what was given: some KerasHub blocks' `call` takes the
            # hidden states alone.
            kwargs = {
                name: value for name, value in (
                    ("attention_mask", attention_mask), ("training", training)
                ) if value is not None
            }
            return self._keras_block().call(self, hidden_states, **kwargs)
        shape = ops.shape(hidden_states)
        tokens = ops.reshape(hidden_states, (-1, shape[-1]))
        router_logits, weights, experts = self.route(tokens)
        context = current_context()
        num_valid = None if context is None else context.real_tokens()
        mesh = None if context is None else context.mesh
        out = self.routed_output(
            tokens, weights, experts, num_valid,
            grouped_kernel=expert_groups.tpu_kernel_fits(mesh),
        )
        shared = self.shared_expert_output(tokens)
        if shared is not None:
            out = out + shared
        return ops.reshape(out, shape), router_logits

    def routed_output(self, tokens, weights, experts, num_valid=None,
                      grouped_kernel=False):
        """The weighted sum of each token's routed experts, `[T, H]`.

        Args:
            tokens: `[T, H]`.
            weights: `[T, k]` router weights.
            experts: int `[T, k]` expert indices.
            num_valid: the real tokens among the `T` (the rest are padding
                and computed by no expert): a count (the first ones) or a
                `[T]` bool mask, or None for all.
            grouped_kernel: whether to run tpu-inference's grouped matmul
                kernel (TPU, one device) instead of the XLA tile loop.
        """
        input_kernels, output_kernel = self.expert_kernels()
        input_kernels = [ops.convert_to_tensor(k) for k in input_kernels]
        output_kernel = ops.convert_to_tensor(output_kernel)
        biases = self.expert_biases()
        if biases is None:
            biases = ((None,) * len(input_kernels), None)
        biases = [
            None if b is None else ops.convert_to_tensor(b)
            for b in list(biases[0]) + [biases[1]]
        ]
        num_tokens, top_k = experts.shape
        num_experts = output_kernel.shape[0]
        order, counts = expert_groups.sort_pairs(
            experts, num_valid, num_experts
        )
        rows = ops.take(tokens, order // top_k, axis=0)
        if grouped_kernel:
            # Each sorted row's expert, for its biases; rows in no group
            # (padding, sorted last) stay zero, as the grouped matmul
            # leaves them.
            row_experts = jnp.minimum(
                jnp.reshape(experts, (-1,))[order].astype(jnp.int32),
                num_experts - 1,
            )
            grouped = (jnp.arange(rows.shape[0]) < jnp.sum(counts))[:, None]

            def project(x, kernel, bias):
                out = expert_groups.grouped_matmul_tpu(x, counts, kernel)
                if bias is None:
                    return out
                bias = ops.take(bias, row_experts, axis=0)
                return out + jnp.where(grouped, bias, jnp.zeros_like(bias))

            projected = [
                project(rows, kernel, bias)
                for kernel, bias in zip(input_kernels, biases)
            ]
            out = project(
                self.expert_hidden(*projected), output_kernel, biases[-1]
            )
        else:
            with_bias = tuple(b is not None for b in biases)
            out = expert_groups.grouped_ffn_cpu(
                rows, counts,
                lambda tile, *params: self._expert_ffn(
                    tile, with_bias, *params
                ),
                input_kernels + [output_kernel]
                + [b for b in biases if b is not None],
                expert_groups.tile_rows_for(num_tokens * top_k, num_experts),
            )
        # Back to (token, slot) order, then each token's weighted sum.
        pairs = jnp.zeros_like(out).at[order].set(out)
        pairs = ops.reshape(pairs, (num_tokens, top_k, -1))
        weights = ops.cast(weights, tokens.dtype)
        return ops.sum(pairs * weights[:, :, None], axis=1)

    def _expert_ffn(self, tile, with_bias, *params):
        """One expert's feed-forward on a tile: `params` are its kernels
        (inputs, then output) and then its biases, where `with_bias` says
        (one flag per kernel) which kernels have one."""
        kernels = params[:len(with_bias)]
        rest = iter(params[len(with_bias):])
        biases = [next(rest) if has else None for has in with_bias]

        def apply(x, kernel, bias):
            out = ops.matmul(x, kernel)
            return out if bias is None else out + bias

        projected = [
            apply(tile, k, b) for k, b in zip(kernels[:-1], biases[:-1])
        ]
        return apply(self.expert_hidden(*projected), kernels[-1], biases[-1])
