"""Format-aware hostile cases for the artifact's trust boundary (issue 13).

Each case edits a good artifact's own files as an attacker would, and
rewrites the manifest's checksums (and the tokenizer fingerprint) so that
checksum verification passes and a deeper check must refuse it. Classes:

- `outside`: a field or file that would make a reader open a path outside
  the artifact (canary files stand at those paths), or a non-regular file;
- `integrity`: the weights index disagrees with orbax or the model, or a
  delta artifact does not pin what its backbone reads;
- `bounds`: a config, asset or count that would allocate or work far
  beyond what is stored;
- `exec`: a value that a careless loader would execute (it would create
  the code-execution canary).

`CASES` holds `Case(name, klass, base, mutate, message, may_load)`: `base`
is the good artifact it starts from (`spm`: a full Llama, `bpe`: a full
GPT-2, `delta`: a Llama delta over a local preset); `message` a regular
expression every refusal must match; `may_load` the readers that do not
read the damaged part, which must then either refuse or load what the
good artifact loads.
"""

import collections
import json
import os
import shutil
import socket

from keras_vllm import format as fmt

from helpers import hostile_edits as edits

Case = collections.namedtuple(
    "Case", "name klass base mutate message may_load"
)
CASES = []
READERS = ("keras", "tokenizer", "inspect", "verify")
# Readers that read no weights (and the inspect command, which reads none).
NOT_WEIGHTS = ("tokenizer", "inspect")
NOT_PRESET = ("tokenizer", "inspect")


def case(klass, base, message, may_load=()):
    def register(fn):
        CASES.append(Case(fn.__name__, klass, base, fn, message, may_load))
        return fn

    return register


def _add(name, klass, base, mutate, message, may_load=()):
    mutate.__name__ = name
    CASES.append(Case(name, klass, base, mutate, message, may_load))


# --------------------------------------------------------------------------
# Edits that keep checksums and the tokenizer fingerprint valid.
# --------------------------------------------------------------------------


def set_tokenizer_config(d, fn):
    """Edits the tokenizer config in the manifest and tokenizer/config.json
    alike, with a fresh fingerprint and file table."""
    m = edits.read_manifest(d)
    result = fn(m["tokenizer"]["config"])
    if result is not None:
        m["tokenizer"]["config"] = result
    stored = m["tokenizer"]["config"]
    edits.write_manifest(d, m)
    edits.edit_json(
        d, fmt.TOKENIZER_CONFIG_FILE, lambda t: t.update(config=stored), False
    )
    refingerprint(d)


def refingerprint(d):
    edits.rehash_files(d)
    m = edits.read_manifest(d)
    m["tokenizer"]["fingerprint"] = edits.fingerprint(m)
    edits.write_manifest(d, m)


def set_section_config(d, role, fn):
    m = edits.read_manifest(d)
    fn(m[role]["config"])
    edits.write_manifest(d, m)
    edits.rehash_files(d)


def sparse_file(path, size):
    """A file of `size` bytes without writing them (holes read as zeros)."""
    with open(path, "wb") as f:
        f.truncate(size)


def replace_with(d, rel, make):
    path = os.path.join(d, rel)
    os.remove(path)
    make(path)


def unix_socket(path):
    # Bound by a relative name: socket paths are limited to 108 bytes.
    cwd = os.getcwd()
    os.chdir(os.path.dirname(path))
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(os.path.basename(path))
        s.close()
    finally:
        os.chdir(cwd)


def rename_orbax_key(d, old, new):
    """Renames a variable in orbax's tree metadata and the manifest alike."""
    rel = f"{fmt.WEIGHTS_DIR}/_METADATA"
    meta_path = os.path.join(d, rel)
    with open(meta_path) as f:
        meta = json.load(f)
    tree = meta["tree_metadata"]
    for key, entry in list(tree.items()):
        if "/".join(k["key"] for k in entry["key_metadata"]) == old:
            parts = new.split("/")
            entry["key_metadata"] = [{"key": p, "key_type": 2} for p in parts]
            del tree[key]
            tree[str(tuple(parts))] = entry
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    m = edits.read_manifest(d)
    m["weights"]["variables"][new] = m["weights"]["variables"].pop(old)
    edits.write_manifest(d, m)
    edits.rehash_files(d)


def variables(d):
    return edits.read_manifest(d)["weights"]["variables"]


def var_at(d, suffix):
    return next(p for p in sorted(variables(d)) if p.endswith(suffix))


def copy_preset(d, ctx, edit=None):
    """A copy of the delta artifact's preset, optionally edited, pinned by
    the artifact with fresh hashes; returns the copy's path."""
    m = edits.read_manifest(d)
    copy = os.path.join(ctx["scratch"], "preset")
    shutil.copytree(m["preset"]["handle"], copy)
    if edit is not None:
        edit(copy)
    m["preset"]["handle"] = copy
    m["preset"]["files"] = {
        name: fmt.sha256_file(os.path.join(copy, name))
        for name in m["preset"]["files"]
        if os.path.isfile(os.path.join(copy, name))
    }
    edits.write_manifest(d, m)
    return copy


def edit_preset_config(copy, fn):
    path = os.path.join(copy, "config.json")
    with open(path) as f:
        config = json.load(f)
    fn(config)
    with open(path, "w") as f:
        json.dump(config, f)


# --------------------------------------------------------------------------
# 1. Outside reads: asset paths in configs, at every depth and in every role.
# --------------------------------------------------------------------------

_ASSET_MESSAGE = r"'[a-z_]+\.config(\.[A-Za-z_]+|\[\d+\])*\.(proto|vocabulary|merges)' is set"

for _target in ("canary_file", "canary_fifo", "/dev/zero", "/proc/self/environ", "../../../canary", "/etc/passwd"):
    _slug = _target.strip("./").replace("/", "_") or "rel"

    def _proto(d, ctx, target=_target):
        value = ctx.get(target, target)
        set_tokenizer_config(d, lambda c: c.update(proto=value))

    _add(f"spm_proto_path_{_slug}", "outside", "spm", _proto, _ASSET_MESSAGE)

    def _vocab(d, ctx, target=_target):
        value = ctx.get(target, target)
        set_tokenizer_config(d, lambda c: c.update(vocabulary=value))

    _add(f"bpe_vocabulary_path_{_slug}", "outside", "bpe", _vocab, _ASSET_MESSAGE)

    def _merges(d, ctx, target=_target):
        value = ctx.get(target, target)
        set_tokenizer_config(d, lambda c: c.update(merges=value))

    _add(f"bpe_merges_path_{_slug}", "outside", "bpe", _merges, _ASSET_MESSAGE)


@case("outside", "spm", _ASSET_MESSAGE)
def spm_proto_base64_inline(d, ctx):
    # Over 2048 base64 characters keras-hub decodes as inline proto bytes.
    with open(ctx["canary_file"], "rb") as f:
        import base64

        inline = base64.b64encode(f.read()).decode()
    set_tokenizer_config(d, lambda c: c.update(proto=inline))


@case("outside", "bpe", _ASSET_MESSAGE)
def bpe_vocabulary_inline_dict(d, ctx):
    set_tokenizer_config(d, lambda c: c.update(vocabulary={"a": 0, "b": 1}))


@case("outside", "bpe", _ASSET_MESSAGE)
def bpe_merges_inline_list(d, ctx):
    set_tokenizer_config(d, lambda c: c.update(merges=["a b"]))


def _nested_tokenizer(path):
    return {
        "module": "keras_hub.src.models.gpt2.gpt2_tokenizer",
        "class_name": "GPT2Tokenizer",
        "registered_name": "keras_hub>GPT2Tokenizer",
        "config": {"vocabulary": path, "merges": path},
    }


for _role in ("tokenizer", "preprocessor", "sampler", "backbone", "causal_lm"):

    def _nested(d, ctx, role=_role):
        nested = _nested_tokenizer(ctx["canary_fifo"])
        if role == "tokenizer":
            set_tokenizer_config(d, lambda c: c.update(extra_layer=nested))
        else:
            set_section_config(d, role, lambda c: c.update(extra_layer=nested))

    _add(f"nested_tokenizer_in_{_role}", "outside", "spm", _nested, _ASSET_MESSAGE)


@case("outside", "spm", _ASSET_MESSAGE)
def nested_tokenizer_as_dtype(d, ctx):
    nested = _nested_tokenizer(ctx["canary_fifo"])
    set_tokenizer_config(d, lambda c: c.update(dtype=nested))


@case("outside", "spm", _ASSET_MESSAGE)
def nested_proto_in_list(d, ctx):
    set_section_config(
        d, "preprocessor", lambda c: c.update(extra=[{"proto": ctx["canary_file"]}])
    )


@case("outside", "spm", r"'tokenizer\.config\.config_file' is '/etc/passwd'")
def tokenizer_config_file_absolute(d, ctx):
    set_tokenizer_config(d, lambda c: c.update(config_file="/etc/passwd"))


@case("outside", "spm", r"'preprocessor\.config\.config_file' is '\.\./\.\./x\.json'")
def preprocessor_config_file_relative(d, ctx):
    set_section_config(d, "preprocessor", lambda c: c.update(config_file="../../x.json"))


@case("outside", "spm", r"tokenizer config has 'spm_file', which LlamaTokenizer does not take", may_load=("inspect",))
def tokenizer_unknown_kwarg(d, ctx):
    set_tokenizer_config(d, lambda c: c.update(spm_file=ctx["canary_file"]))


@case("outside", "spm", r"preprocessor config has 'tokenizer_file', which", may_load=NOT_WEIGHTS)
def preprocessor_unknown_kwarg(d, ctx):
    set_section_config(
        d, "preprocessor", lambda c: c.update(tokenizer_file=ctx["canary_file"])
    )


@case("outside", "spm", r"sampler config has 'path', which \w+Sampler does not take", may_load=NOT_WEIGHTS)
def sampler_unknown_kwarg(d, ctx):
    set_section_config(d, "sampler", lambda c: c.update(path=ctx["canary_file"]))


# Non-regular files and links in the artifact (checksums rewritten from the
# regular file first, so only the file type is wrong).
_SPECIAL = {
    "fifo": os.mkfifo,
    "socket": unix_socket,
    "symlink_canary": None,  # filled per case: a link to the canary
    "symlink_fifo": None,
}
for _rel in (
    fmt.GOLDEN_FILE,
    fmt.TOKENIZER_CONFIG_FILE,
    f"{fmt.TOKENIZER_ASSETS_DIR}/vocabulary.spm",
    fmt.CONFIG_FILE,
    f"{fmt.WEIGHTS_DIR}/_METADATA",
    fmt.CHAT_TEMPLATE_FILE,
):
    for _kind in _SPECIAL:
        _slug = _rel.replace("/", "_").replace(".", "_")

        def _special(d, ctx, rel=_rel, kind=_kind):
            if kind == "fifo":
                replace_with(d, rel, os.mkfifo)
            elif kind == "socket":
                replace_with(d, rel, unix_socket)
            elif kind == "symlink_canary":
                replace_with(d, rel, lambda p: os.symlink(ctx["canary_file"], p))
            else:
                replace_with(d, rel, lambda p: os.symlink(ctx["canary_fifo"], p))

        _add(
            f"{_kind}_as_{_slug}",
            "outside",
            "spm",
            _special,
            r"is not a regular file|is a symbolic link|resolves outside",
        )


for _path in ("../escape/kernel", "/abs/kernel", "a/./b", "a//b", "a/b.c", "x\\..\\y"):

    def _varpath(d, ctx, path=_path):
        m = edits.read_manifest(d)
        name = edits.first_var(m)
        m["weights"]["variables"][path] = m["weights"]["variables"].pop(name)
        edits.write_manifest(d, m)

    _add(
        "variable_path_" + "".join(c if c.isalnum() else "_" for c in _path),
        "outside",
        "spm",
        _varpath,
        r"not a Keras variable path",
    )


for _name in (
    "metadata.json",
    "tokenizer.json",
    "preprocessor.json",
    "assets",
    "model.weights.h5.bak",
    "model_1.weights.h5",
):

    def _pin(d, ctx, name=_name):
        edits.edit(
            d, lambda m: m["preset"]["files"].update({name: edits.ZERO_SHA})
        )

    _add(
        "preset_pins_" + _name.replace(".", "_"),
        "outside",
        "delta",
        _pin,
        r"'preset\.files' names '[^']+', which a KerasHub backbone does not read",
        may_load=NOT_PRESET,
    )


@case("outside", "delta", r"is not a regular file", may_load=NOT_PRESET)
def preset_weights_fifo(d, ctx):
    def edit(copy):
        os.remove(os.path.join(copy, "model.weights.h5"))
        os.mkfifo(os.path.join(copy, "model.weights.h5"))

    copy_preset(d, ctx, edit)
    m = edits.read_manifest(d)
    m["preset"]["files"]["model.weights.h5"] = edits.ZERO_SHA
    edits.write_manifest(d, m)


@case("outside", "delta", r"is not a regular file", may_load=NOT_PRESET)
def preset_weights_dev_zero(d, ctx):
    def edit(copy):
        os.remove(os.path.join(copy, "model.weights.h5"))
        os.symlink("/dev/zero", os.path.join(copy, "model.weights.h5"))

    copy_preset(d, ctx, edit)
    m = edits.read_manifest(d)
    m["preset"]["files"]["model.weights.h5"] = edits.ZERO_SHA
    edits.write_manifest(d, m)


def _sharded(copy, shard_names, keep_single=False):
    index = {"metadata": {}, "weight_map": {"/vars": shard_names}}
    with open(os.path.join(copy, "model.weights.json"), "w") as f:
        json.dump(index, f)
    for name in shard_names:
        if "/" not in name and not name.startswith("."):
            shutil.copy(
                os.path.join(copy, "model.weights.h5"), os.path.join(copy, name)
            )
    if not keep_single:
        os.remove(os.path.join(copy, "model.weights.h5"))


def _pin_sharded(d, ctx, shard_names, keep_single=False, pin=None):
    copy = copy_preset(d, ctx, lambda c: _sharded(c, shard_names, keep_single))
    m = edits.read_manifest(d)
    files = {"config.json": m["preset"]["files"]["config.json"]}
    for name in ["model.weights.json"] + list(pin if pin is not None else shard_names):
        path = os.path.join(copy, name)
        files[name] = (
            fmt.sha256_file(path) if os.path.isfile(path) else edits.ZERO_SHA
        )
    m["preset"]["files"] = files
    edits.write_manifest(d, m)


for _shard in ("../../outside.weights.h5", "/etc/passwd", "model_00000.weights.h5/../../x"):

    def _shard_case(d, ctx, shard=_shard):
        _pin_sharded(d, ctx, [shard], pin=["model_00000.weights.h5"])

    _add(
        "preset_index_names_" + "".join(c if c.isalnum() else "_" for c in _shard),
        "outside",
        "delta",
        _shard_case,
        r"not a shard file of the preset",
        may_load=NOT_PRESET,
    )


@case("outside", "delta", r"loads through 'model\.weights\.h5', which the artifact does not pin", may_load=NOT_PRESET)
def preset_unpinned_single_beside_shards(d, ctx):
    # keras-hub reads model.weights.h5 whenever it exists, so pinning the
    # shards of an index beside it would pin files that are never read.
    _pin_sharded(d, ctx, ["model_00000.weights.h5"], keep_single=True)


@case("outside", "delta", r"names other shards than the artifact pins", may_load=NOT_PRESET)
def preset_index_unpinned_shard(d, ctx):
    _pin_sharded(
        d, ctx, ["model_00000.weights.h5", "model_00001.weights.h5"],
        pin=["model_00000.weights.h5"],
    )


@case("outside", "spm", r"uses '\{% include %\}'")
def chat_template_include(d, ctx):
    with open(os.path.join(d, fmt.CHAT_TEMPLATE_FILE), "w") as f:
        f.write("{% include '" + ctx["canary_file"] + "' %}")
    edits.rehash_files(d)


@case("outside", "spm", r"uses '\{% import %\}'")
def chat_template_import(d, ctx):
    with open(os.path.join(d, fmt.CHAT_TEMPLATE_FILE), "w") as f:
        f.write("{%- import '/etc/passwd' as x -%}{{ x }}")
    edits.rehash_files(d)


@case("outside", "spm", r"uses '\{% extends %\}'")
def chat_template_extends(d, ctx):
    with open(os.path.join(d, fmt.CHAT_TEMPLATE_FILE), "w") as f:
        f.write("{% extends '../../../etc/passwd' %}")
    edits.rehash_files(d)


@case("outside", "spm", r"'use_ocdbt' must be true")
def orbax_without_ocdbt(d, ctx):
    edits.edit_json(d, f"{fmt.WEIGHTS_DIR}/_METADATA", lambda m: m.update(use_ocdbt=False))


@case("exec", "spm", r"names the handler 'os\.system'")
def orbax_handler_named(d, ctx):
    edits.edit_json(
        d,
        f"{fmt.WEIGHTS_DIR}/_CHECKPOINT_METADATA",
        lambda m: m.update(item_handlers="os.system"),
    )


@case("exec", "spm", r"is not stored as an array")
def orbax_value_type_pickle(d, ctx):
    def fn(meta):
        entry = next(iter(meta["tree_metadata"].values()))
        entry["value_metadata"]["value_type"] = "pickle"

    edits.edit_json(d, f"{fmt.WEIGHTS_DIR}/_METADATA", fn)


@case("exec", "spm", r"is not stored as an array")
def orbax_skip_deserialize(d, ctx):
    def fn(meta):
        entry = next(iter(meta["tree_metadata"].values()))
        entry["value_metadata"]["skip_deserialize"] = True

    edits.edit_json(d, f"{fmt.WEIGHTS_DIR}/_METADATA", fn)


@case("exec", "spm", r"serialized Keras object .*not on the allowlist")
def lambda_layer_in_preprocessor(d, ctx):
    payload = {
        "module": "keras.layers",
        "class_name": "Lambda",
        "registered_name": None,
        "config": {"function": f"__import__('os').system('touch {ctx['exec_canary']}')"},
    }
    set_section_config(d, "preprocessor", lambda c: c.update(extra=payload))


@case("exec", "spm", r"not on the allowlist")
def exec_in_registered_name(d, ctx):
    edits.edit(
        d,
        lambda m: m["sampler"].update(
            registered_name=f"__import__('os').system('touch {ctx['exec_canary']}')"
        ),
    )


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
