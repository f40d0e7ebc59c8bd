"""The case registry and the edits the hostile cases are made of.

`hostile_files` and `hostile_contents` register their cases here with
`@case(error, message)`; `hostile_corpus.make_corpus` writes them.
"""

import hashlib
import json
import os

from keras_vllm import format as fmt

# case name -> a regular expression the error message must match.
EXPECTED_MESSAGES = {}

CASES = []

# A well-formed SHA-256 that matches no file.
ZERO_SHA = "0" * 64


def case(error, message):
    def register(fn):
        CASES.append((fn.__name__, fn, error))
        EXPECTED_MESSAGES[fn.__name__] = message
        return fn

    return register


# --------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------


def read_manifest(d):
    with open(os.path.join(d, fmt.MANIFEST_FILE), encoding="utf-8") as f:
        return json.load(f)


def write_manifest(d, manifest):
    fmt.write_json(os.path.join(d, fmt.MANIFEST_FILE), manifest)


def edit(d, fn):
    manifest = read_manifest(d)
    result = fn(manifest)
    write_manifest(d, manifest if result is None else result)


def rehash_files(d, manifest=None):
    """Rewrites the file table to match the files on disk."""
    manifest = manifest or read_manifest(d)
    table = {}
    for root, dirs, files in os.walk(d):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, d).replace(os.sep, "/")
            if rel == fmt.MANIFEST_FILE or os.path.islink(full):
                continue
            table[rel] = {
                "sha256": fmt.sha256_file(full),
                "bytes": os.path.getsize(full),
            }
    manifest["files"] = table
    write_manifest(d, manifest)


def edit_json(d, rel, fn, rehash=True):
    path = os.path.join(d, rel)
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    result = fn(value)
    fmt.write_json(path, value if result is None else result)
    if rehash:
        rehash_files(d)


def largest_weight_file(d):
    best = None
    for root, _, files in os.walk(os.path.join(d, fmt.WEIGHTS_DIR)):
        for name in files:
            full = os.path.join(root, name)
            if best is None or os.path.getsize(full) > os.path.getsize(best):
                best = full
    return best


def flip(path, offset=None):
    with open(path, "r+b") as f:
        size = os.path.getsize(path)
        offset = size // 2 if offset is None else offset
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def asset(d):
    return os.path.join(d, fmt.TOKENIZER_ASSETS_DIR, "vocabulary.spm")


def first_var(m):
    return sorted(m["weights"]["variables"])[0]


def fingerprint(m):
    files = m["files"]
    digest = hashlib.sha256()
    for name in sorted(m["tokenizer"]["assets"]):
        digest.update(name.encode())
        digest.update(
            files[f"{fmt.TOKENIZER_ASSETS_DIR}/{name}"]["sha256"].encode()
        )
    digest.update(json.dumps(m["tokenizer"]["config"], sort_keys=True).encode())
    return digest.hexdigest()


def set_backbone(d, **values):
    """Changes backbone config values in the manifest and config.json
    consistently, with a matching file table."""
    m = read_manifest(d)
    m["backbone"]["config"].update(values)
    write_manifest(d, m)
    names = {
        "hidden_dim": "hidden_size",
        "vocabulary_size": "vocab_size",
        "num_layers": "num_hidden_layers",
    }
    config = {names[k]: v for k, v in values.items() if k in names}
    edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(config))


def raw_manifest(d, transform):
    path = os.path.join(d, fmt.MANIFEST_FILE)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(transform(data))


def foreign_spm(out_dir, family="gemma", vocabulary_size=None):
    """A SentencePiece model trained for another model (by default Gemma's
    tiny tokenizer), saved once beside the corpus."""
    path = os.path.join(
        out_dir, f"_foreign_{family}_{vocabulary_size}", "vocabulary.spm"
    )
    if not os.path.exists(path):
        from keras_vllm import testing

        tokenizer = testing.build_tiny_tokenizer(family, vocabulary_size)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tokenizer.save_assets(os.path.dirname(path))
    return path
