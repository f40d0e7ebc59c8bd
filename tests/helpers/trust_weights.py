"""Trust cases, classes `integrity` and `bounds`: the weights index, the
preset pins, and configs, assets and counts beyond what is stored."""

import os
import shutil

from keras_vllm import format as fmt

from helpers import hostile_edits as edits
from helpers.trust_edits import NOT_PRESET
from helpers.trust_edits import NOT_WEIGHTS
from helpers.trust_edits import _add
from helpers.trust_edits import case
from helpers.trust_edits import copy_preset
from helpers.trust_edits import edit_preset_config
from helpers.trust_edits import refingerprint
from helpers.trust_edits import rename_orbax_key
from helpers.trust_edits import sparse_file
from helpers.trust_edits import var_at


# --------------------------------------------------------------------------
# 2. Integrity beyond the checksums.
# --------------------------------------------------------------------------


for _drop in (("model.weights.h5",), ("config.json",), ("config.json", "model.weights.h5")):

    def _unpin(d, ctx, drop=_drop):
        def fn(m):
            for name in drop:
                del m["preset"]["files"][name]

        edits.edit(d, fn)

    _add(
        "delta_unpins_" + "_".join(n.replace(".", "_") for n in _drop),
        "integrity",
        "delta",
        _unpin,
        r"must pin every preset file the backbone reads",
        may_load=NOT_PRESET,
    )


@case("integrity", "delta", r"differs from the one this artifact was exported against", may_load=NOT_PRESET)
def delta_preset_weights_changed(d, ctx):
    def edit(copy):
        edits.flip(os.path.join(copy, "model.weights.h5"))

    copy = copy_preset(d, ctx, edit)
    # The artifact still pins the original hash.
    m = edits.read_manifest(d)
    m["preset"]["files"]["model.weights.h5"] = fmt.sha256_file(
        os.path.join(ctx["preset"], "model.weights.h5")
    )
    m["preset"]["handle"] = copy
    edits.write_manifest(d, m)


@case("integrity", "delta", r"holds a different backbone than the one", may_load=NOT_PRESET)
def delta_preset_config_other_model(d, ctx):
    copy_preset(
        d, ctx,
        lambda c: edit_preset_config(c, lambda cfg: cfg["config"].update(layer_norm_epsilon=0.5)),
    )


@case("integrity", "delta", r"holds a different backbone than the one", may_load=NOT_PRESET)
def delta_preset_config_other_class(d, ctx):
    copy_preset(
        d, ctx,
        lambda c: edit_preset_config(c, lambda cfg: cfg.update(registered_name="keras_hub>MistralBackbone")),
    )


@case("bounds", "delta", r"holds only \d+ bytes of weights", may_load=NOT_PRESET)
def delta_config_and_preset_inflated(d, ctx):
    # The attacker controls both configs (manifest and a preset copy), but
    # not the size of the preset's weights.
    def inflate(cfg):
        cfg.update(num_layers=3000)

    copy_preset(d, ctx, lambda c: edit_preset_config(c, lambda cfg: inflate(cfg["config"])))
    edits.edit(d, lambda m: inflate(m["backbone"]["config"]))
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(num_hidden_layers=3000))


@case("integrity", "spm", r"both claim position \d+")
def duplicate_position(d, ctx):
    def fn(m):
        specs = m["weights"]["variables"]
        a, b = sorted(specs)[:2]
        specs[b]["index"] = specs[a]["index"]

    edits.edit(d, fn)


@case("integrity", "spm", r"a full export lists \d+ variables but records")
def full_export_total_raised(d, ctx):
    edits.edit(d, lambda m: m["weights"].update(total_variables=m["weights"]["total_variables"] + 1))


@case("integrity", "spm", r"but the backbone has \d+ variables")
def index_beyond_total(d, ctx):
    edits.edit(
        d,
        lambda m: m["weights"]["variables"][edits.first_var(m)].update(index=5000),
    )


def _swap_layers(d, a, b):
    """Records layer a's query kernel under layer b's path and vice versa
    (orbax keys renamed alike), positions unchanged."""
    qa = f"transformer_layer_{a}/self_attention/query/kernel"
    qb = f"transformer_layer_{b}/self_attention/query/kernel"
    rename_orbax_key(d, qa, "tmp_swap/kernel")
    rename_orbax_key(d, qb, qa)
    rename_orbax_key(d, "tmp_swap/kernel", qb)


@case("integrity", "spm", r"stores variable 'transformer_layer_1/self_attention/query/kernel' at position|stores variable 'transformer_layer_0/self_attention/query/kernel' at position", may_load=NOT_WEIGHTS)
def path_names_other_layer_swapped(d, ctx):
    _swap_layers(d, 0, 1)


@case("integrity", "spm", r"stores variable 'transformer_layer_1/self_attention/key/kernel' at position", may_load=NOT_WEIGHTS)
def path_names_other_layer(d, ctx):
    old = "transformer_layer_0/self_attention/key/kernel"
    m = edits.read_manifest(d)
    # Point layer 1's recorded entry at layer 0's position instead.
    rename_orbax_key(d, old, "transformer_layer_9/self_attention/key/kernel")
    m = edits.read_manifest(d)
    v = m["weights"]["variables"]
    v["transformer_layer_1/self_attention/key/kernel"]["index"], v[
        "transformer_layer_9/self_attention/key/kernel"
    ]["index"] = (
        v["transformer_layer_9/self_attention/key/kernel"]["index"],
        v["transformer_layer_1/self_attention/key/kernel"]["index"],
    )
    edits.write_manifest(d, m)


@case("integrity", "spm", r"stores variable '.*' at position", may_load=NOT_WEIGHTS)
def swapped_positions_same_shape(d, ctx):
    def fn(m):
        v = m["weights"]["variables"]
        a = "transformer_layer_0/self_attention/query/kernel"
        b = "transformer_layer_1/self_attention/query/kernel"
        v[a]["index"], v[b]["index"] = v[b]["index"], v[a]["index"]

    edits.edit(d, fn)


@case("integrity", "spm", r"stores variable 'token_embedding_7/embeddings' at position", may_load=NOT_WEIGHTS)
def explicit_name_renumbered(d, ctx):
    # Only names Keras numbers itself may carry another number.
    rename_orbax_key(d, "token_embedding/embeddings", "token_embedding_7/embeddings")


for _dtype in ("bfloat16", "float16"):

    def _vdtype(d, ctx, dtype=_dtype):
        edits.edit(
            d,
            lambda m: m["weights"]["variables"][var_at(d, "key/kernel")].update(
                dtype=dtype
            ),
        )

    _add(
        f"variable_dtype_{_dtype}_not_stored",
        "integrity",
        "spm",
        _vdtype,
        r"is recorded as (bfloat16|float16).*holds it as float32|stores float32",
        may_load=NOT_WEIGHTS,
    )


@case("integrity", "spm", r"recorded in the manifest as bfloat16.*stores float32", may_load=NOT_WEIGHTS)
def all_dtypes_bfloat16_not_stored(d, ctx):
    def fn(m):
        m["dtype"] = "bfloat16"
        for spec in m["weights"]["variables"].values():
            spec["dtype"] = "bfloat16"
        m["backbone"]["config"]["dtype"]["config"]["name"] = "bfloat16"

    edits.edit(d, fn)
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(torch_dtype="bfloat16"))


@case("integrity", "spm", r"has shape \(\d+, \d+, \d+\) in the artifact but", may_load=NOT_WEIGHTS)
def variable_shape_permuted(d, ctx):
    def fn(m):
        spec = m["weights"]["variables"][var_at(d, "query/kernel")]
        spec["shape"] = list(reversed(spec["shape"]))

    edits.edit(d, fn)


@case("integrity", "delta", r"stores variable '.*' at position|outside the backbone's", may_load=NOT_WEIGHTS)
def delta_index_moved(d, ctx):
    def fn(m):
        spec = next(iter(m["weights"]["variables"].values()))
        spec["index"] = (spec["index"] + 1) % m["weights"]["total_variables"]

    edits.edit(d, fn)


# --------------------------------------------------------------------------
# 3. Bounds before allocation.
# --------------------------------------------------------------------------


for _key, _value in (
    ("num_layers", 200),
    ("intermediate_dim", 128 * 400),
    ("num_layers", 2000),
):

    def _inflate(d, ctx, key=_key, value=_value):
        edits.set_backbone(d, **{key: value})
        if key == "intermediate_dim":
            edits.rehash_files(d)

    _add(
        f"config_inflated_{_key}_{_value}",
        "bounds",
        "spm",
        _inflate,
        r"implies about .* parameters, but the artifact stores",
        may_load=("tokenizer",),
    )


@case("bounds", "spm", r"does not match the stored token embedding", may_load=("tokenizer",))
def config_vocabulary_beyond_embedding(d, ctx):
    edits.set_backbone(d, vocabulary_size=38400)


@case("bounds", "spm", r"does not match the stored token embedding", may_load=("tokenizer",))
def config_hidden_beyond_embedding(d, ctx):
    m = edits.read_manifest(d)
    m["backbone"]["config"]["hidden_dim"] = 128
    edits.write_manifest(d, m)
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(hidden_size=128, head_dim=32))


for _rel, _size in (
    (f"{fmt.TOKENIZER_ASSETS_DIR}/vocabulary.spm", fmt.MAX_TOKENIZER_ASSET_BYTES + 1),
    (fmt.GOLDEN_FILE, fmt.MAX_GOLDEN_BYTES + 1),
    (fmt.CHAT_TEMPLATE_FILE, fmt.MAX_CHAT_TEMPLATE_BYTES + 1),
    (fmt.TOKENIZER_CONFIG_FILE, fmt.MAX_SMALL_JSON_BYTES + 1),
    (fmt.GENERATION_CONFIG_FILE, fmt.MAX_SMALL_JSON_BYTES + 1),
    (f"{fmt.WEIGHTS_DIR}/_METADATA", fmt.MAX_MANIFEST_BYTES + 1),
):

    def _huge(d, ctx, rel=_rel, size=_size):
        sparse_file(os.path.join(d, rel), size)
        # Recorded honestly: the bound, not the checksum, must refuse it.
        m = edits.read_manifest(d)
        m["files"][rel] = {"sha256": edits.ZERO_SHA, "bytes": size}
        edits.write_manifest(d, m)

    _add(
        "oversized_" + _rel.replace("/", "_").replace(".", "_"),
        "bounds",
        "spm",
        _huge,
        r"is \d+ bytes, more than the \d+ the format allows",
    )


@case("bounds", "spm", r"'max_new_tokens' is 100000, not between 0 and the served")
def golden_steps_beyond_sequence(d, ctx):
    edits.edit_json(d, fmt.GOLDEN_FILE, lambda g: g.update(max_new_tokens=100000))


@case("bounds", "spm", r"more than the \d+ decoding steps")
def golden_work_beyond_budget(d, ctx):
    def fn(g):
        g["max_new_tokens"] = 100
        g["outputs"] = g["outputs"][:1] * 1000

    edits.edit_json(d, fmt.GOLDEN_FILE, fn)
    edits.edit(d, lambda m: m.update(max_sequence_length=128))
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(max_position_embeddings=128))


@case("bounds", "spm", r"exceeds the served sequence length")
def golden_prompt_beyond_sequence(d, ctx):
    def fn(g):
        g["outputs"][0]["prompt_ids"] = g["outputs"][0]["prompt_ids"] * 600

    edits.edit_json(d, fmt.GOLDEN_FILE, fn)


@case("bounds", "spm", r"characters of probe text, more than")
def tokenizer_probe_text_bomb(d, ctx):
    def fn(m):
        probe = dict(m["tokenizer"]["golden"][0], text="a" * 99_999, ids=[])
        m["tokenizer"]["golden"] = [probe] * 11

    edits.edit(d, fn)


@case("bounds", "spm", r"vocabulary has 512 entries but the backbone's embedding has 384 rows", may_load=("inspect",))
def tokenizer_larger_than_embedding(d, ctx):
    shutil.copy(ctx["spm_512"], edits.asset(d))
    refingerprint(d)


@case("bounds", "bpe", r"'max_new_tokens' is \d+, not between|exceeds the served sequence length")
def served_length_shrunk_below_golden(d, ctx):
    edits.edit(d, lambda m: m.update(max_sequence_length=2))
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(max_position_embeddings=2))


@case("bounds", "bpe", r"implies about .* parameters, but the artifact stores", may_load=("tokenizer",))
def bpe_config_inflated(d, ctx):
    edits.set_backbone(d, num_layers=500)


@case("bounds", "bpe", r"does not match the stored token embedding", may_load=("tokenizer",))
def bpe_vocabulary_beyond_embedding(d, ctx):
    edits.set_backbone(d, vocabulary_size=51200)
