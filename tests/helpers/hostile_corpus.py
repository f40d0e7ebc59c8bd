"""Generates malformed and hostile artifacts from a good one.

`make_corpus(good_artifact_dir, out_dir)` copies the good artifact once per
case and damages the copy: truncation, bit flips, path traversal, symlinks
out of the artifact, huge or negative dimensions, wrong dtypes, missing and
extra files, manifest type confusion, swapped tokenizer assets, config and
manifest that disagree, class names off the allowlist, version skew.

Many cases also rewrite the manifest's file table ("rehash") so that the
checksums pass and a deeper check has to catch the damage, as it would for
a deliberately crafted artifact.

Run as a script to write a corpus:

    python tests/helpers/hostile_corpus.py GOOD_ARTIFACT OUT_DIR
"""

import hashlib
import json
import os
import shutil
import sys

from keras_vllm import artifact
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import PresetUnavailableError
from keras_vllm.errors import VersionSkewError

# case name -> a regular expression the error message must match.
EXPECTED_MESSAGES = {}

_CASES = []


def case(error, message):
    def register(fn):
        _CASES.append((fn.__name__, fn, error))
        EXPECTED_MESSAGES[fn.__name__] = message
        return fn

    return register


# --------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------


def _manifest(d):
    with open(os.path.join(d, artifact.MANIFEST_FILE), encoding="utf-8") as f:
        return json.load(f)


def _write_manifest(d, manifest):
    artifact.write_json(os.path.join(d, artifact.MANIFEST_FILE), manifest)


def _edit(d, fn):
    manifest = _manifest(d)
    result = fn(manifest)
    _write_manifest(d, manifest if result is None else result)


def _rehash(d, manifest=None):
    """Rewrites the file table to match the files on disk."""
    manifest = manifest or _manifest(d)
    table = {}
    for root, dirs, files in os.walk(d):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, d).replace(os.sep, "/")
            if rel == artifact.MANIFEST_FILE or os.path.islink(full):
                continue
            table[rel] = {
                "sha256": artifact.sha256_file(full),
                "bytes": os.path.getsize(full),
            }
    manifest["files"] = table
    _write_manifest(d, manifest)


def _edit_json(d, rel, fn, rehash=True):
    path = os.path.join(d, rel)
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    result = fn(value)
    artifact.write_json(path, value if result is None else result)
    if rehash:
        _rehash(d)


def _largest_weight_file(d):
    best = None
    for root, _, files in os.walk(os.path.join(d, artifact.WEIGHTS_DIR)):
        for name in files:
            full = os.path.join(root, name)
            if best is None or os.path.getsize(full) > os.path.getsize(best):
                best = full
    return best


def _flip(path, offset=None):
    with open(path, "r+b") as f:
        size = os.path.getsize(path)
        offset = size // 2 if offset is None else offset
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _asset(d):
    return os.path.join(d, artifact.TOKENIZER_ASSETS_DIR, "vocabulary.spm")


def _first_var(m):
    return sorted(m["weights"]["variables"])[0]


def _fingerprint(m):
    files = m["files"]
    digest = hashlib.sha256()
    for name in sorted(m["tokenizer"]["assets"]):
        digest.update(name.encode())
        digest.update(
            files[f"{artifact.TOKENIZER_ASSETS_DIR}/{name}"]["sha256"].encode()
        )
    digest.update(json.dumps(m["tokenizer"]["config"], sort_keys=True).encode())
    return digest.hexdigest()


def _set_backbone(d, **values):
    """Changes backbone config values in the manifest and config.json
    consistently, with a matching file table."""
    m = _manifest(d)
    m["backbone"]["config"].update(values)
    _write_manifest(d, m)
    names = {
        "hidden_dim": "hidden_size",
        "vocabulary_size": "vocab_size",
        "num_layers": "num_hidden_layers",
    }
    config = {names[k]: v for k, v in values.items() if k in names}
    _edit_json(d, artifact.CONFIG_FILE, lambda c: c.update(config))


def _raw_manifest(d, transform):
    path = os.path.join(d, artifact.MANIFEST_FILE)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(transform(data))


def _foreign_spm(out_dir, family="gemma", vocabulary_size=None):
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


# --------------------------------------------------------------------------
# Truncation.
# --------------------------------------------------------------------------


@case(IntegrityError, r"weights/.*has \d+ bytes")
def truncated_weights(d, ctx):
    _truncate(_largest_weight_file(d))


@case(ArtifactError, r"manifest\.json is not valid JSON")
def truncated_manifest(d, ctx):
    _truncate(os.path.join(d, artifact.MANIFEST_FILE))


@case(IntegrityError, r"tokenizer/assets/vocabulary\.spm.*bytes")
def truncated_tokenizer_asset(d, ctx):
    _truncate(_asset(d))


@case(IntegrityError, r"'config\.json' has 0 bytes")
def emptied_config_json(d, ctx):
    open(os.path.join(d, artifact.CONFIG_FILE), "w").close()


@case(ArtifactError, r"weights/_METADATA is not valid JSON")
def truncated_orbax_metadata_rehashed(d, ctx):
    _truncate(os.path.join(d, artifact.WEIGHTS_DIR, "_METADATA"))
    _rehash(d)


@case(ArtifactError, r"golden\.json is not valid JSON")
def truncated_golden_rehashed(d, ctx):
    _truncate(os.path.join(d, artifact.GOLDEN_FILE))
    _rehash(d)


# --------------------------------------------------------------------------
# Bit flips.
# --------------------------------------------------------------------------


@case(IntegrityError, r"weights/.*does not match its SHA-256")
def bitflip_weights(d, ctx):
    _flip(_largest_weight_file(d))


@case(IntegrityError, r"vocabulary\.spm' does not match its SHA-256")
def bitflip_tokenizer_asset(d, ctx):
    _flip(_asset(d))


@case(IntegrityError, r"'golden\.json' does not match its SHA-256")
def bitflip_golden(d, ctx):
    _flip(os.path.join(d, artifact.GOLDEN_FILE), 5)


@case(IntegrityError, r"'weights/manifest\.ocdbt' does not match")
def bitflip_orbax_manifest(d, ctx):
    _flip(os.path.join(d, artifact.WEIGHTS_DIR, "manifest.ocdbt"))


@case(ArtifactError, r"'dtype' is 'floau32'")
def bitflip_manifest_dtype(d, ctx):
    # 't' (0x74) -> 'u' (0x75): one bit.
    _raw_manifest(
        d, lambda b: b.replace(b'"dtype": "float32"', b'"dtype": "floau32"')
    )


@case(IntegrityError, r"does not match its SHA-256")
def bitflip_manifest_checksum(d, ctx):
    def fn(m):
        entry = m["files"][artifact.GENERATION_CONFIG_FILE]
        digest = entry["sha256"]
        entry["sha256"] = ("1" if digest[0] == "0" else "0") + digest[1:]

    _edit(d, fn)


# --------------------------------------------------------------------------
# Path traversal.
# --------------------------------------------------------------------------

_SHA = "0" * 64


@case(ArtifactError, r"leaves the artifact directory")
def traversal_dotdot(d, ctx):
    _edit(
        d, lambda m: m["files"].update({"../outside.txt": {"sha256": _SHA, "bytes": 1}})
    )


@case(ArtifactError, r"is absolute")
def traversal_absolute(d, ctx):
    _edit(
        d, lambda m: m["files"].update({"/etc/passwd": {"sha256": _SHA, "bytes": 1}})
    )


@case(ArtifactError, r"leaves the artifact directory")
def traversal_backslash(d, ctx):
    _edit(
        d,
        lambda m: m["files"].update(
            {"tokenizer\\..\\..\\x": {"sha256": _SHA, "bytes": 1}}
        ),
    )


@case(ArtifactError, r"'preset\.files' names '\.\./\.\./etc/passwd'")
def traversal_preset_file(d, ctx):
    def fn(m):
        m["preset"] = {
            "handle": "/nonexistent/preset",
            "files": {"../../etc/passwd": _SHA},
        }
        m["weights"]["mode"] = "delta"

    _edit(d, fn)


@case(ArtifactError, r"tokenizer asset '\.\./\.\./config\.json' is not a plain")
def traversal_tokenizer_asset(d, ctx):
    _edit(d, lambda m: m["tokenizer"].update(assets=["../../config.json"]))


# --------------------------------------------------------------------------
# Symlinks and special files.
# --------------------------------------------------------------------------


@case(ArtifactError, r"'tokenizer/assets/vocabulary\.spm' (is a symbolic link|resolves outside the artifact)")
def symlink_asset_out(d, ctx):
    outside = os.path.join(ctx["scratch"], "outside_vocabulary.spm")
    shutil.copy(_asset(d), outside)
    os.remove(_asset(d))
    os.symlink(outside, _asset(d))


@case(ArtifactError, r"'tokenizer/assets' is a symbolic link")
def symlink_directory_out(d, ctx):
    assets = os.path.join(d, artifact.TOKENIZER_ASSETS_DIR)
    outside = os.path.join(ctx["scratch"], "outside_assets")
    shutil.copytree(assets, outside)
    shutil.rmtree(assets)
    os.symlink(outside, assets)


@case(ArtifactError, r"'weights' is a symbolic link")
def symlink_weights_dir_out(d, ctx):
    weights = os.path.join(d, artifact.WEIGHTS_DIR)
    outside = os.path.join(ctx["scratch"], "outside_weights")
    shutil.copytree(weights, outside)
    shutil.rmtree(weights)
    os.symlink(outside, weights)


@case(ArtifactError, r"manifest\.json' is a symbolic link")
def symlink_manifest(d, ctx):
    path = os.path.join(d, artifact.MANIFEST_FILE)
    outside = os.path.join(ctx["scratch"], "outside_manifest.json")
    shutil.copy(path, outside)
    os.remove(path)
    os.symlink(outside, path)


@case(ArtifactError, r"'golden\.json' is not a regular file")
def fifo_instead_of_file(d, ctx):
    # Reading a FIFO would hang: it must be refused without opening it.
    path = os.path.join(d, artifact.GOLDEN_FILE)
    os.remove(path)
    os.mkfifo(path)


# --------------------------------------------------------------------------
# Huge or negative dimensions.
# --------------------------------------------------------------------------


@case(ArtifactError, r"implies about .* parameters.*KERAS_VLLM_MAX_PARAMETERS")
def huge_hidden_dim(d, ctx):
    _set_backbone(d, hidden_dim=1 << 22, vocabulary_size=1 << 22)


@case(ArtifactError, r"implies about .* parameters")
def huge_layers_and_intermediate(d, ctx):
    _set_backbone(d, num_layers=1 << 20)
    _edit(d, lambda m: m["backbone"]["config"].update(intermediate_dim=1 << 22))
    _rehash(d)


@case(ArtifactError, r"'backbone\.config\.num_layers' is -1; sizes must be positive")
def negative_num_layers(d, ctx):
    _set_backbone(d, num_layers=-1)


@case(ArtifactError, r"'backbone\.config\.hidden_dim' is 1000000000000, outside")
def out_of_range_int(d, ctx):
    _edit(d, lambda m: m["backbone"]["config"].update(hidden_dim=10**12))


@case(ArtifactError, r"too many elements")
def huge_variable_shape(d, ctx):
    _edit(
        d,
        lambda m: m["weights"]["variables"][_first_var(m)].update(
            shape=[1 << 24, 1 << 24]
        ),
    )


@case(ArtifactError, r"has dimension -64 out of range")
def negative_variable_shape(d, ctx):
    _edit(
        d,
        lambda m: m["weights"]["variables"][_first_var(m)].update(shape=[-64, 64]),
    )


@case(ArtifactError, r"more than the recorded 'parameter_count'")
def enlarged_variable_shape(d, ctx):
    def fn(m):
        spec = m["weights"]["variables"][_first_var(m)]
        spec["shape"] = [s * 2 for s in spec["shape"]]

    _edit(d, fn)


@case(ArtifactError, r"'max_sequence_length' out of range")
def huge_max_sequence_length(d, ctx):
    _edit(d, lambda m: m.update(max_sequence_length=1 << 40))


@case(ArtifactError, r"manifest\.json is not valid JSON")
def thousand_digit_integer(d, ctx):
    _raw_manifest(
        d,
        lambda b: b.replace(
            b'"parameter_count": ', b'"parameter_count": ' + b"9" * 5000 + b", \"x\": "
        ),
    )


# --------------------------------------------------------------------------
# Wrong dtypes.
# --------------------------------------------------------------------------


@case(ArtifactError, r"'dtype' is 'int8'")
def dtype_int8(d, ctx):
    _edit(d, lambda m: m.update(dtype="int8"))


@case(ArtifactError, r"dtype 'complex128' is not one of")
def variable_dtype_complex(d, ctx):
    _edit(
        d,
        lambda m: m["weights"]["variables"][_first_var(m)].update(dtype="complex128"),
    )


@case(ArtifactError, r"'manifest\.dtype' must be a string")
def dtype_type_confusion(d, ctx):
    _edit(d, lambda m: m.update(dtype=32))


@case(ArtifactError, r"'torch_dtype' is bfloat16 in config\.json but float32")
def config_json_dtype_disagrees(d, ctx):
    _edit_json(d, artifact.CONFIG_FILE, lambda c: c.update(torch_dtype="bfloat16"))


@case(ArtifactError, r"'backbone\.config\.dtype' is a serialized Keras object")
def dtype_policy_swapped_for_layer(d, ctx):
    _edit(
        d,
        lambda m: m["backbone"]["config"].update(
            dtype={
                "module": "keras.layers",
                "class_name": "Lambda",
                "config": {"function": "os.system"},
                "registered_name": None,
            }
        ),
    )


# --------------------------------------------------------------------------
# Missing and extra files.
# --------------------------------------------------------------------------


@case(IntegrityError, r"weights/.*is missing")
def missing_weight_file(d, ctx):
    os.remove(_largest_weight_file(d))


@case(IntegrityError, r"'tokenizer/assets/vocabulary\.spm' is missing")
def missing_tokenizer_asset(d, ctx):
    os.remove(_asset(d))


@case(ArtifactError, r"has no manifest\.json")
def missing_manifest(d, ctx):
    os.remove(os.path.join(d, artifact.MANIFEST_FILE))


@case(IntegrityError, r"'golden\.json' is missing from the manifest")
def missing_golden_unlisted(d, ctx):
    os.remove(os.path.join(d, artifact.GOLDEN_FILE))
    _rehash(d)


@case(IntegrityError, r"'config\.json' is missing from the manifest")
def missing_config_json_unlisted(d, ctx):
    os.remove(os.path.join(d, artifact.CONFIG_FILE))
    _rehash(d)


@case(IntegrityError, r"'notes\.txt' is not listed in the manifest")
def extra_file_unlisted(d, ctx):
    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("hello")


@case(ArtifactError, r"'evil\.py', which is not part of the keras-vllm format")
def extra_file_listed(d, ctx):
    with open(os.path.join(d, "evil.py"), "w") as f:
        f.write("import os; os.system('id')\n")
    _rehash(d)


@case(ArtifactError, r"'weights/evil\.pkl', which is not a file an orbax")
def extra_pickle_in_weights(d, ctx):
    import pickle

    with open(os.path.join(d, artifact.WEIGHTS_DIR, "evil.pkl"), "wb") as f:
        pickle.dump({"a": 1}, f)
    _rehash(d)


@case(ArtifactError, r"unknown field 'post_load_hook'")
def extra_manifest_field(d, ctx):
    _edit(d, lambda m: m.update(post_load_hook="os.system"))


@case(ArtifactError, r"config\.json has the field 'auto_map'")
def config_json_auto_map(d, ctx):
    _edit_json(
        d,
        artifact.CONFIG_FILE,
        lambda c: c.update(auto_map={"AutoModel": "evil.EvilModel"}),
    )


@case(ArtifactError, r"config\.json has the field 'quantization_config'")
def config_json_quantization(d, ctx):
    _edit_json(
        d,
        artifact.CONFIG_FILE,
        lambda c: c.update(quantization_config={"quant_method": "fp8"}),
    )


# --------------------------------------------------------------------------
# Manifest type confusion.
# --------------------------------------------------------------------------


@case(ArtifactError, r"the manifest must be a JSON object")
def manifest_is_list(d, ctx):
    _edit(d, lambda m: [m])


@case(ArtifactError, r"'manifest\.format_version' must be a list")
def format_version_string(d, ctx):
    _edit(d, lambda m: m.update(format_version="1.0"))


@case(ArtifactError, r"'manifest\.files' must be an object")
def files_is_list(d, ctx):
    _edit(d, lambda m: m.update(files=sorted(m["files"])))


@case(ArtifactError, r"'weights\.variables' must be an object")
def variables_is_list(d, ctx):
    _edit(d, lambda m: m["weights"].update(variables=[1, 2]))


@case(ArtifactError, r"'stop_token_ids' must be non-negative integers")
def stop_ids_strings(d, ctx):
    _edit(d, lambda m: m.update(stop_token_ids=["2"]))


@case(ArtifactError, r"'manifest\.max_sequence_length' must be an integer")
def max_len_bool(d, ctx):
    _edit(d, lambda m: m.update(max_sequence_length=True))


@case(ArtifactError, r"'backbone\.config' must be an object")
def backbone_config_list(d, ctx):
    _edit(d, lambda m: m["backbone"].update(config=[]))


@case(ArtifactError, r"'backbone\.registered_name' must be a string")
def registered_name_int(d, ctx):
    _edit(d, lambda m: m["backbone"].update(registered_name=5))


@case(ArtifactError, r"non-standard constant NaN")
def nan_in_config(d, ctx):
    _raw_manifest(
        d, lambda b: b.replace(b'"layer_norm_epsilon": ', b'"layer_norm_epsilon": NaN, "x": ')
    )


@case(ArtifactError, r"duplicate key 'dtype'")
def duplicate_keys(d, ctx):
    _raw_manifest(d, lambda b: b.replace(b'"dtype": "float32"', b'"dtype": "float32", "dtype": "int8"', 1))


@case(ArtifactError, r"manifest\.json is not UTF-8")
def non_utf8_manifest(d, ctx):
    _raw_manifest(d, lambda b: b.replace(b'"created": "', b'"created": "\xff\xfe'))


@case(ArtifactError, r"nested too deeply")
def deeply_nested_config(d, ctx):
    deep = 0
    for _ in range(40):
        deep = [deep]
    _edit(d, lambda m: m["preprocessor"]["config"].update(extra=deep))


@case(ArtifactError, r"manifest\.json is not valid JSON")
def recursion_bomb(d, ctx):
    _raw_manifest(
        d, lambda b: b.replace(b'"created": ', b'"x": ' + b"[" * 200_000 + b"]" * 200_000 + b', "created": ')
    )


@case(ArtifactError, r"'backbone\.config\.name' is too long")
def huge_string(d, ctx):
    _edit(d, lambda m: m["backbone"]["config"].update(name="x" * 200_000))


@case(ArtifactError, r"'preprocessor\.config\.extra' is too long")
def huge_list(d, ctx):
    _edit(d, lambda m: m["preprocessor"]["config"].update(extra=[0] * 20_000))


@case(ArtifactError, r"sha256 is not a hex SHA-256")
def sha_not_hex(d, ctx):
    _edit(d, lambda m: m["files"][artifact.GOLDEN_FILE].update(sha256="z" * 64))


@case(ArtifactError, r"bytes is negative")
def negative_file_size(d, ctx):
    _edit(d, lambda m: m["files"][artifact.GOLDEN_FILE].update(bytes=-1))


@case(ArtifactError, r"'tokenizer\.golden' must be a list")
def tokenizer_golden_string(d, ctx):
    _edit(d, lambda m: m["tokenizer"].update(golden="x"))


@case(ArtifactError, r"tokenizer\.start_token_id' is 1e\+30|'tokenizer\.start_token_id' is")
def tokenizer_float_token_id(d, ctx):
    _edit(d, lambda m: m["tokenizer"].update(start_token_id=1e30))


# --------------------------------------------------------------------------
# Swapped tokenizer assets.
# --------------------------------------------------------------------------


@case(IntegrityError, r"tokenizer fingerprint")
def swapped_tokenizer_rehashed(d, ctx):
    shutil.copy(_foreign_spm(ctx["out_dir"]), _asset(d))
    _rehash(d)


def _swap_and_refingerprint(d, spm):
    shutil.copy(spm, _asset(d))
    _rehash(d)
    m = _manifest(d)
    m["tokenizer"]["fingerprint"] = _fingerprint(m)
    _write_manifest(d, m)


@case(ArtifactError, r"tokenizer assets could not be loaded.*Cannot find special token")
def swapped_tokenizer_refingerprinted(d, ctx):
    # Gemma's SentencePiece model lacks Llama's special tokens.
    _swap_and_refingerprint(d, _foreign_spm(ctx["out_dir"]))


@case(IntegrityError, r"does not reproduce the token ids")
def swapped_tokenizer_same_family(d, ctx):
    # Another Llama tokenizer: it loads, but tokenizes differently.
    _swap_and_refingerprint(d, _foreign_spm(ctx["out_dir"], "llama", 320))


@case(ArtifactError, r"pairs a LlamaCausalLMPreprocessor with a GPT2Tokenizer")
def swapped_tokenizer_class(d, ctx):
    def fn(t):
        t.update(
            class_name="GPT2Tokenizer",
            registered_name="keras_hub>GPT2Tokenizer",
            module="keras_hub.src.models.gpt2.gpt2_tokenizer",
        )

    _edit_json(d, artifact.TOKENIZER_CONFIG_FILE, fn, rehash=False)
    m = _manifest(d)
    fn(m["tokenizer"])
    _write_manifest(d, m)
    _rehash(d)


# --------------------------------------------------------------------------
# Config and manifest that disagree.
# --------------------------------------------------------------------------


@case(ArtifactError, r"'hidden_size' is 128 in config\.json but 64")
def config_json_hidden_disagrees(d, ctx):
    _edit_json(d, artifact.CONFIG_FILE, lambda c: c.update(hidden_size=128))


@case(ArtifactError, r"'num_hidden_layers' is 3 in config\.json but 2")
def config_json_layers_disagree(d, ctx):
    _edit_json(d, artifact.CONFIG_FILE, lambda c: c.update(num_hidden_layers=3))


@case(ArtifactError, r"'vocab_size' is 100000 in config\.json")
def config_json_vocab_disagrees(d, ctx):
    _edit_json(d, artifact.CONFIG_FILE, lambda c: c.update(vocab_size=100000))


@case(ArtifactError, r"'max_position_embeddings' is 1000000 in config\.json")
def config_json_positions_disagree(d, ctx):
    _edit_json(
        d, artifact.CONFIG_FILE, lambda c: c.update(max_position_embeddings=1000000)
    )


@case(ArtifactError, r"tokenizer/config\.json and the manifest's tokenizer section")
def tokenizer_config_disagrees(d, ctx):
    _edit_json(
        d,
        artifact.TOKENIZER_CONFIG_FILE,
        lambda t: t["config"].update(add_bos=True),
    )


@case(ArtifactError, r"checkpoint and the manifest list different variables")
def manifest_drops_variable(d, ctx):
    def fn(m):
        del m["weights"]["variables"][_first_var(m)]
        m["weights"]["total_variables"] -= 1

    _edit(d, fn)


@case(ArtifactError, r"'stop_token_ids' is 999999, not a token id")
def stop_id_beyond_vocabulary(d, ctx):
    _edit(d, lambda m: m.update(stop_token_ids=[999999]))
    _edit_json(d, artifact.CONFIG_FILE, lambda c: c.update(eos_token_id=[999999]))


@case(ArtifactError, r"golden\.json must be an object with 'max_new_tokens'")
def golden_malformed(d, ctx):
    _edit_json(d, artifact.GOLDEN_FILE, lambda g: {"outputs": "x"})


@case(ArtifactError, r"golden\.json: 'output_ids' is a, not a token id")
def golden_ids_strings(d, ctx):
    _edit_json(
        d, artifact.GOLDEN_FILE, lambda g: g["outputs"][0].update(output_ids=["a"])
    )


@case(ArtifactError, r"generation_config\.json: 'temperature' has the wrong type")
def generation_config_type(d, ctx):
    _edit_json(
        d, artifact.GENERATION_CONFIG_FILE, lambda g: g.update(temperature="hot")
    )


@case(ArtifactError, r"'top_p' is 5")
def generation_config_range(d, ctx):
    _edit_json(d, artifact.GENERATION_CONFIG_FILE, lambda g: g.update(top_p=5))


@case(ArtifactError, r"generation_config\.json has the field 'logits_processors'")
def generation_config_extra(d, ctx):
    _edit_json(
        d,
        artifact.GENERATION_CONFIG_FILE,
        lambda g: g.update(logits_processors=["evil.Processor"]),
    )


@case(ArtifactError, r"chat_template\.jinja is not UTF-8")
def chat_template_binary(d, ctx):
    with open(os.path.join(d, artifact.CHAT_TEMPLATE_FILE), "wb") as f:
        f.write(b"\xff\xfe{{ evil }}")
    _rehash(d)


@case(ArtifactError, r"'weights\.mode' is 'preset' but the artifact has 'weights/'")
def preset_mode_with_weight_files(d, ctx):
    def fn(m):
        m["weights"].update(mode="preset", variables={})
        m["preset"] = {"handle": "/nonexistent/preset", "files": {}}

    _edit(d, fn)


@case(ArtifactError, r"'weights\.directory' must be 'weights'")
def weights_directory_elsewhere(d, ctx):
    _edit(d, lambda m: m["weights"].update(directory="../elsewhere"))


@case(PresetUnavailableError, r"/nonexistent/tiny_llama_preset.*(offline|weights='full')")
def delta_preset_unavailable(d, ctx):
    def fn(m):
        m["weights"]["mode"] = "delta"
        m["preset"] = {
            "handle": "/nonexistent/tiny_llama_preset",
            "files": {"config.json": _SHA, "model.weights.h5": _SHA},
        }

    _edit(d, fn)


@case(ArtifactError, r"backbone config has 'evil_hook', which LlamaBackbone does not take")
def backbone_config_unknown_argument(d, ctx):
    _edit(d, lambda m: m["backbone"]["config"].update(evil_hook="os.system"))


# --------------------------------------------------------------------------
# Class names off the allowlist.
# --------------------------------------------------------------------------


def _set_class(role, name, module=None):
    def mutate(d, ctx):
        def fn(m):
            m[role]["registered_name"] = name
            m[role].pop("class_name", None)
            if module is not None:
                m[role]["module"] = module

        _edit(d, fn)

    return mutate


for _name, _role, _cls, _fragment in [
    ("class_not_a_class", "backbone", "keras_hub>NotAClass", "not on the allowlist"),
    ("class_not_registered", "backbone", "keras_hub>NotABackbone", "not on the allowlist"),
    ("class_keras_dense", "backbone", "keras>Dense", "not on the allowlist"),
    ("class_builtins_eval", "sampler", "builtins>eval", "not on the allowlist"),
    ("class_os_system", "tokenizer", "os>system", "not on the allowlist"),
    (
        "class_module_path",
        "backbone",
        "keras_hub.src.models.llama.llama_backbone.LlamaBackbone",
        "not on the allowlist",
    ),
    ("class_wrong_role", "backbone", "keras_hub>LlamaCausalLM", "not on the allowlist"),
    (
        "class_wrong_family",
        "causal_lm",
        "keras_hub>GemmaCausalLM",
        "pairs a GemmaCausalLM with a LlamaBackbone",
    ),
]:
    _fn = _set_class(_role, _cls)
    _fn.__name__ = _name
    case(ArtifactError, _fragment)(_fn)


@case(ArtifactError, r"module 'os' is not a keras-hub module")
def class_module_field(d, ctx):
    _edit(d, lambda m: m["backbone"].update(module="os"))


# --------------------------------------------------------------------------
# Version skew.
# --------------------------------------------------------------------------


@case(VersionSkewError, r"format version 2\.0.*Upgrade keras-vllm")
def newer_format_major(d, ctx):
    _edit(d, lambda m: m.update(format_version=[2, 0]))


@case(VersionSkewError, r"format version 0\.9.*Re-export")
def older_format_major(d, ctx):
    _edit(d, lambda m: m.update(format_version=[0, 9]))


@case(VersionSkewError, r"keras-hub 7\.1\.0.*keras-hub 7\.x")
def other_keras_hub_major(d, ctx):
    _edit(d, lambda m: m["written_by"].update(keras_hub="7.1.0"))


@case(ArtifactError, r"'format' must be 'keras_vllm'")
def other_format(d, ctx):
    _edit(d, lambda m: m.update(format="safetensors"))


# --------------------------------------------------------------------------


def make_corpus(good_artifact_dir, out_dir):
    """Writes every hostile case as a damaged copy of a good artifact.

    Args:
        good_artifact_dir: an artifact of a tiny llama (full weights).
        out_dir: where to write the cases (one directory each).

    Returns:
        A list of `(case_name, path, expected_error_type)`; the message each
        error must match is `EXPECTED_MESSAGES[case_name]`.
    """
    good_artifact_dir = os.fspath(good_artifact_dir)
    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for name, mutate, error in _CASES:
        path = os.path.join(out_dir, name, "artifact")
        scratch = os.path.join(out_dir, name, "outside")
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os.makedirs(scratch)
        shutil.copytree(good_artifact_dir, path)
        mutate(path, {"scratch": scratch, "out_dir": out_dir})
        cases.append((name, path, error))
    return cases


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    for name, path, error in make_corpus(sys.argv[1], sys.argv[2]):
        print(f"{name:40s} {error.__name__:24s} {path}")
