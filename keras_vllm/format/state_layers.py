"""`config.json`'s recurrent-state fields (format 1.10).

A model whose layers keep a per-sequence recurrent state (linear attention
such as Gated DeltaNet) is served with vLLM state slots for those layers
instead of KV caches. Its `config.json` says which of the `num_hidden_layers`
layers (vLLM's `layer.{i}`) they are and their one state layout:

- `recurrent_state_layers`: the layer indices, ascending;
- `recurrent_state_shapes`: one shape per state array, without the slot axis
  (e.g. the conv window `[kernel - 1, conv_dim]` and the delta-rule state
  `[value_heads, key_head_dim, value_head_dim]`);
- `recurrent_state_dtypes`: one dtype name per state array.

The three come together, only in 1.10+ artifacts; older artifacts never
have them and read as before.
"""

from keras_vllm.format.checks import fail
from keras_vllm.format.checks import is_int
from keras_vllm.format.names import MAX_DIM

KEYS = (
    "recurrent_state_layers",
    "recurrent_state_shapes",
    "recurrent_state_dtypes",
)
DTYPES = ("float32", "bfloat16", "float16")


def validate(config, version, what):
    """Checks the recurrent-state fields of a `config.json`.

    Args:
        config: the parsed `config.json`.
        version: the manifest's `format_version`.
        what: the file's name, for messages.

    Raises:
        ArtifactError: a field is malformed, comes without the others, or
            appears in an artifact older than 1.10.
    """
    present = [key for key in KEYS if key in config]
    if not present:
        return
    if tuple(version) < (1, 10):
        fail(
            f"{what} has '{present[0]}', which format versions before 1.10 "
            "never write. The file was altered; re-export the model."
        )
    if len(present) != len(KEYS):
        fail(f"{what}: {', '.join(repr(k) for k in KEYS)} come together.")
    layers = config["recurrent_state_layers"]
    count = config["num_hidden_layers"]
    if not (
        layers
        and all(is_int(i) and 0 <= i < count for i in layers)
        and list(layers) == sorted(set(layers))
        and len(layers) < count
    ):
        fail(
            f"{what}: 'recurrent_state_layers' must list distinct ascending "
            f"layer indices below {count}, leaving an attention layer."
        )
    shapes = config["recurrent_state_shapes"]
    dtypes = config["recurrent_state_dtypes"]
    if not (
        shapes
        and len(shapes) == len(dtypes) <= 8
        and all(
            isinstance(shape, list)
            and 0 < len(shape) <= 8
            and all(is_int(d) and 0 < d <= MAX_DIM for d in shape)
            for shape in shapes
        )
    ):
        fail(f"{what}: 'recurrent_state_shapes' is malformed.")
    if not all(dtype in DTYPES for dtype in dtypes):
        fail(
            f"{what}: 'recurrent_state_dtypes' must name dtypes among "
            f"{', '.join(DTYPES)}."
        )
