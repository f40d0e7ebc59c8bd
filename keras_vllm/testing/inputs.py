"""The inputs a tiny model is called on directly (a forward pass, `fit`).

Most backbones take `token_ids` and `padding_mask`; some (Gemma 4) also
`position_ids`, which their `CausalLM` preprocessor would add.
"""

import numpy as np


def with_position_ids(causal_lm, inputs):
    """`inputs` plus `position_ids` (0, 1, ... per row) when the model's
    backbone takes them (Gemma 4), for calling it on token ids."""
    backbone = getattr(causal_lm, "backbone", None)
    names = [t.name.split(":")[0] for t in getattr(backbone, "inputs", [])]
    if "position_ids" not in names or "position_ids" in inputs:
        return inputs
    shape = np.shape(inputs["token_ids"])
    positions = np.broadcast_to(np.arange(shape[1], dtype="int32"), shape)
    return dict(inputs, position_ids=np.array(positions))

