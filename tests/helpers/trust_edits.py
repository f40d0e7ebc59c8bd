"""The registry and the edits of the trust corpus (`trust_cases`).

Every edit keeps the checksums (and the tokenizer fingerprint) valid, so a
deeper check than checksum verification has to refuse the case.
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


