"""What system B needs to run vLLM's PyTorch models through torchax.

tpu-inference has flax models of its own for some families (Qwen2, Llama
3, ...) and runs vLLM's PyTorch model classes for the others through
torchax. vLLM 0.32's `LayerNorm` (GPT-2's) asks `torch.promote_types` for
its compute dtype, which torchax 0.0.13 cannot run ("Operator with name
aten::promote_types has no lowering"), so B could not serve GPT-2 at all.
`answer_promote_types` gives torchax that function: the same promotion,
computed by JAX on the dtypes (no tensor is involved). Only B's worker
calls it; keras-vllm's own serving never goes through torchax.
"""


def answer_promote_types():
    """Lets torchax answer `torch.promote_types` (in every torchax
    environment made from now on, and in the default one)."""
    import jax.numpy as jnp
    import torch
    import torchax
    from torchax.ops import mappings
    from torchax.ops import ops_registry

    def promote_types(first, second):
        promoted = jnp.promote_types(
            mappings.t2j_dtype(first), mappings.t2j_dtype(second)
        )
        return mappings.j2t_dtype(promoted)

    ops_registry.register_torch_function_op(
        torch.promote_types, promote_types, is_jax_function=False
    )
    torchax.default_env().override_op_definition(
        torch.promote_types, promote_types
    )
