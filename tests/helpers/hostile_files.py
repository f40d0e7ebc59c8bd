"""Hostile cases that damage files: truncation, bit flips, path traversal,
symlinks and special files, huge or negative sizes, wrong dtypes, missing
and extra files."""

import os
import shutil

from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError

from helpers import hostile_edits as edits


# --------------------------------------------------------------------------
# Truncation.
# --------------------------------------------------------------------------


@edits.case(IntegrityError, r"weights/.*has \d+ bytes")
def truncated_weights(d, ctx):
    edits.truncate(edits.largest_weight_file(d))


@edits.case(ArtifactError, r"manifest\.json is not valid JSON")
def truncated_manifest(d, ctx):
    edits.truncate(os.path.join(d, fmt.MANIFEST_FILE))


@edits.case(IntegrityError, r"tokenizer/assets/vocabulary\.spm.*bytes")
def truncated_tokenizer_asset(d, ctx):
    edits.truncate(edits.asset(d))


@edits.case(IntegrityError, r"'config\.json' has 0 bytes")
def emptied_config_json(d, ctx):
    open(os.path.join(d, fmt.CONFIG_FILE), "w").close()


@edits.case(ArtifactError, r"weights/_METADATA is not valid JSON")
def truncated_orbax_metadata_rehashed(d, ctx):
    edits.truncate(os.path.join(d, fmt.WEIGHTS_DIR, "_METADATA"))
    edits.rehash_files(d)


@edits.case(ArtifactError, r"golden\.json is not valid JSON")
def truncated_golden_rehashed(d, ctx):
    edits.truncate(os.path.join(d, fmt.GOLDEN_FILE))
    edits.rehash_files(d)


# --------------------------------------------------------------------------
# Bit flips.
# --------------------------------------------------------------------------


@edits.case(IntegrityError, r"weights/.*does not match its SHA-256")
def bitflip_weights(d, ctx):
    edits.flip(edits.largest_weight_file(d))


@edits.case(IntegrityError, r"vocabulary\.spm' does not match its SHA-256")
def bitflip_tokenizer_asset(d, ctx):
    edits.flip(edits.asset(d))


@edits.case(IntegrityError, r"'golden\.json' does not match its SHA-256")
def bitflip_golden(d, ctx):
    edits.flip(os.path.join(d, fmt.GOLDEN_FILE), 5)


@edits.case(IntegrityError, r"'weights/manifest\.ocdbt' does not match")
def bitflip_orbax_manifest(d, ctx):
    edits.flip(os.path.join(d, fmt.WEIGHTS_DIR, "manifest.ocdbt"))


@edits.case(ArtifactError, r"'dtype' is 'floau32'")
def bitflip_manifest_dtype(d, ctx):
    # 't' (0x74) -> 'u' (0x75): one bit.
    edits.raw_manifest(
        d, lambda b: b.replace(b'"dtype": "float32"', b'"dtype": "floau32"')
    )


@edits.case(IntegrityError, r"does not match its SHA-256")
def bitflip_manifest_checksum(d, ctx):
    def fn(m):
        entry = m["files"][fmt.GENERATION_CONFIG_FILE]
        digest = entry["sha256"]
        entry["sha256"] = ("1" if digest[0] == "0" else "0") + digest[1:]

    edits.edit(d, fn)


# --------------------------------------------------------------------------
# Path traversal.
# --------------------------------------------------------------------------



@edits.case(ArtifactError, r"leaves the artifact directory")
def traversal_dotdot(d, ctx):
    edits.edit(
        d, lambda m: m["files"].update({"../outside.txt": {"sha256": edits.ZERO_SHA, "bytes": 1}})
    )


@edits.case(ArtifactError, r"is absolute")
def traversal_absolute(d, ctx):
    edits.edit(
        d, lambda m: m["files"].update({"/etc/passwd": {"sha256": edits.ZERO_SHA, "bytes": 1}})
    )


@edits.case(ArtifactError, r"leaves the artifact directory")
def traversal_backslash(d, ctx):
    edits.edit(
        d,
        lambda m: m["files"].update(
            {"tokenizer\\..\\..\\x": {"sha256": edits.ZERO_SHA, "bytes": 1}}
        ),
    )


@edits.case(ArtifactError, r"'preset\.files' names '\.\./\.\./etc/passwd'")
def traversal_preset_file(d, ctx):
    def fn(m):
        m["preset"] = {
            "handle": "/nonexistent/preset",
            "files": {"../../etc/passwd": edits.ZERO_SHA},
        }
        m["weights"]["mode"] = "delta"

    edits.edit(d, fn)


@edits.case(ArtifactError, r"tokenizer asset '\.\./\.\./config\.json' is not a plain")
def traversal_tokenizer_asset(d, ctx):
    edits.edit(d, lambda m: m["tokenizer"].update(assets=["../../config.json"]))


# --------------------------------------------------------------------------
# Symlinks and special files.
# --------------------------------------------------------------------------


@edits.case(ArtifactError, r"'tokenizer/assets/vocabulary\.spm' (is a symbolic link|resolves outside the artifact)")
def symlink_asset_out(d, ctx):
    outside = os.path.join(ctx["scratch"], "outside_vocabulary.spm")
    shutil.copy(edits.asset(d), outside)
    os.remove(edits.asset(d))
    os.symlink(outside, edits.asset(d))


@edits.case(ArtifactError, r"'tokenizer/assets' is a symbolic link")
def symlink_directory_out(d, ctx):
    assets = os.path.join(d, fmt.TOKENIZER_ASSETS_DIR)
    outside = os.path.join(ctx["scratch"], "outside_assets")
    shutil.copytree(assets, outside)
    shutil.rmtree(assets)
    os.symlink(outside, assets)


@edits.case(ArtifactError, r"'weights' is a symbolic link")
def symlink_weights_dir_out(d, ctx):
    weights = os.path.join(d, fmt.WEIGHTS_DIR)
    outside = os.path.join(ctx["scratch"], "outside_weights")
    shutil.copytree(weights, outside)
    shutil.rmtree(weights)
    os.symlink(outside, weights)


@edits.case(ArtifactError, r"manifest\.json' is a symbolic link")
def symlink_manifest(d, ctx):
    path = os.path.join(d, fmt.MANIFEST_FILE)
    outside = os.path.join(ctx["scratch"], "outside_manifest.json")
    shutil.copy(path, outside)
    os.remove(path)
    os.symlink(outside, path)


@edits.case(ArtifactError, r"'golden\.json' is not a regular file")
def fifo_instead_of_file(d, ctx):
    # Reading a FIFO would hang: it must be refused without opening it.
    path = os.path.join(d, fmt.GOLDEN_FILE)
    os.remove(path)
    os.mkfifo(path)


# --------------------------------------------------------------------------
# Huge or negative dimensions.
# --------------------------------------------------------------------------


@edits.case(ArtifactError, r"implies about .* parameters.*KERAS_VLLM_MAX_PARAMETERS")
def huge_hidden_dim(d, ctx):
    edits.set_backbone(d, hidden_dim=1 << 22, vocabulary_size=1 << 22)


@edits.case(ArtifactError, r"implies about .* parameters")
def huge_layers_and_intermediate(d, ctx):
    edits.set_backbone(d, num_layers=1 << 20)
    edits.edit(d, lambda m: m["backbone"]["config"].update(intermediate_dim=1 << 22))
    edits.rehash_files(d)


@edits.case(ArtifactError, r"'backbone\.config\.num_layers' is -1; sizes must be positive")
def negative_num_layers(d, ctx):
    edits.set_backbone(d, num_layers=-1)


@edits.case(ArtifactError, r"'backbone\.config\.sliding_window_size' is 0; sizes must be positive")
def zero_window_turned_on(d, ctx):
    # 0 is accepted only while the family's flag turns the window off
    # (transformers writes it so for Qwen2-MoE).
    edits.set_backbone(
        d, sliding_window_size=0, use_sliding_window_attention=True
    )


@edits.case(ArtifactError, r"'backbone\.config\.hidden_dim' is 1000000000000, outside")
def out_of_range_int(d, ctx):
    edits.edit(d, lambda m: m["backbone"]["config"].update(hidden_dim=10**12))


@edits.case(ArtifactError, r"too many elements")
def huge_variable_shape(d, ctx):
    edits.edit(
        d,
        lambda m: m["weights"]["variables"][edits.first_var(m)].update(
            shape=[1 << 24, 1 << 24]
        ),
    )


@edits.case(ArtifactError, r"has dimension -64 out of range")
def negative_variable_shape(d, ctx):
    edits.edit(
        d,
        lambda m: m["weights"]["variables"][edits.first_var(m)].update(shape=[-64, 64]),
    )


@edits.case(ArtifactError, r"more than the recorded 'parameter_count'")
def enlarged_variable_shape(d, ctx):
    def fn(m):
        spec = m["weights"]["variables"][edits.first_var(m)]
        spec["shape"] = [s * 2 for s in spec["shape"]]

    edits.edit(d, fn)


@edits.case(ArtifactError, r"'max_sequence_length' out of range")
def huge_max_sequence_length(d, ctx):
    edits.edit(d, lambda m: m.update(max_sequence_length=1 << 40))


@edits.case(ArtifactError, r"manifest\.json is not valid JSON")
def thousand_digit_integer(d, ctx):
    edits.raw_manifest(
        d,
        lambda b: b.replace(
            b'"parameter_count": ', b'"parameter_count": ' + b"9" * 5000 + b", \"x\": "
        ),
    )


# --------------------------------------------------------------------------
# Wrong dtypes.
# --------------------------------------------------------------------------


@edits.case(ArtifactError, r"'dtype' is 'int8'")
def dtype_int8(d, ctx):
    edits.edit(d, lambda m: m.update(dtype="int8"))


@edits.case(ArtifactError, r"dtype 'complex128' is not one of")
def variable_dtype_complex(d, ctx):
    edits.edit(
        d,
        lambda m: m["weights"]["variables"][edits.first_var(m)].update(dtype="complex128"),
    )


@edits.case(ArtifactError, r"'manifest\.dtype' must be a string")
def dtype_type_confusion(d, ctx):
    edits.edit(d, lambda m: m.update(dtype=32))


@edits.case(ArtifactError, r"'torch_dtype' is bfloat16 in config\.json but float32")
def config_json_dtype_disagrees(d, ctx):
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(torch_dtype="bfloat16"))


@edits.case(ArtifactError, r"'backbone\.config\.dtype' is a serialized Keras object")
def dtype_policy_swapped_for_layer(d, ctx):
    edits.edit(
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


@edits.case(IntegrityError, r"weights/.*is missing")
def missing_weight_file(d, ctx):
    os.remove(edits.largest_weight_file(d))


@edits.case(IntegrityError, r"'tokenizer/assets/vocabulary\.spm' is missing")
def missing_tokenizer_asset(d, ctx):
    os.remove(edits.asset(d))


@edits.case(ArtifactError, r"has no manifest\.json")
def missing_manifest(d, ctx):
    os.remove(os.path.join(d, fmt.MANIFEST_FILE))


@edits.case(IntegrityError, r"'golden\.json' is missing from the manifest")
def missing_golden_unlisted(d, ctx):
    os.remove(os.path.join(d, fmt.GOLDEN_FILE))
    edits.rehash_files(d)


@edits.case(IntegrityError, r"'config\.json' is missing from the manifest")
def missing_config_json_unlisted(d, ctx):
    os.remove(os.path.join(d, fmt.CONFIG_FILE))
    edits.rehash_files(d)


@edits.case(IntegrityError, r"'notes\.txt' is not listed in the manifest")
def extra_file_unlisted(d, ctx):
    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("hello")


@edits.case(ArtifactError, r"'evil\.py', which is not part of the keras-vllm format")
def extra_file_listed(d, ctx):
    with open(os.path.join(d, "evil.py"), "w") as f:
        f.write("import os; os.system('id')\n")
    edits.rehash_files(d)


@edits.case(ArtifactError, r"'weights/evil\.pkl', which is not a file an orbax")
def extra_pickle_in_weights(d, ctx):
    import pickle

    with open(os.path.join(d, fmt.WEIGHTS_DIR, "evil.pkl"), "wb") as f:
        pickle.dump({"a": 1}, f)
    edits.rehash_files(d)


@edits.case(ArtifactError, r"unknown field 'post_load_hook'")
def extra_manifest_field(d, ctx):
    edits.edit(d, lambda m: m.update(post_load_hook="os.system"))


@edits.case(ArtifactError, r"config\.json has the field 'auto_map'")
def config_json_auto_map(d, ctx):
    edits.edit_json(
        d,
        fmt.CONFIG_FILE,
        lambda c: c.update(auto_map={"AutoModel": "evil.EvilModel"}),
    )


@edits.case(ArtifactError, r"config\.json has the field 'quantization_config'")
def config_json_quantization(d, ctx):
    edits.edit_json(
        d,
        fmt.CONFIG_FILE,
        lambda c: c.update(quantization_config={"quant_method": "fp8"}),
    )
