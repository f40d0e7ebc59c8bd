"""Trust cases, class `outside` and `exec`: reads outside the artifact,
non-regular files, values a careless loader would execute."""

import base64
import json
import os
import shutil

from keras_vllm import format as fmt

from helpers import hostile_edits as edits
from helpers.trust_edits import NOT_PRESET
from helpers.trust_edits import NOT_WEIGHTS
from helpers.trust_edits import _add
from helpers.trust_edits import case
from helpers.trust_edits import copy_preset
from helpers.trust_edits import replace_with
from helpers.trust_edits import set_section_config
from helpers.trust_edits import set_tokenizer_config
from helpers.trust_edits import unix_socket


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


