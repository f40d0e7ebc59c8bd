"""Hostile cases that damage contents: manifest type confusion, swapped
tokenizer assets, config and manifest that disagree, class names off the
allowlist, version skew."""

import os
import shutil

from keras_vllm import format as fmt
from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.errors import PresetUnavailableError
from keras_vllm.errors import VersionSkewError

from helpers import hostile_edits as edits


# --------------------------------------------------------------------------
# Manifest type confusion.
# --------------------------------------------------------------------------


@edits.case(ArtifactError, r"the manifest must be a JSON object")
def manifest_is_list(d, ctx):
    edits.edit(d, lambda m: [m])


@edits.case(ArtifactError, r"'manifest\.format_version' must be a list")
def format_version_string(d, ctx):
    edits.edit(d, lambda m: m.update(format_version="1.0"))


@edits.case(ArtifactError, r"'manifest\.files' must be an object")
def files_is_list(d, ctx):
    edits.edit(d, lambda m: m.update(files=sorted(m["files"])))


@edits.case(ArtifactError, r"'weights\.variables' must be an object")
def variables_is_list(d, ctx):
    edits.edit(d, lambda m: m["weights"].update(variables=[1, 2]))


@edits.case(ArtifactError, r"'stop_token_ids' must be non-negative integers")
def stop_ids_strings(d, ctx):
    edits.edit(d, lambda m: m.update(stop_token_ids=["2"]))


@edits.case(ArtifactError, r"'manifest\.max_sequence_length' must be an integer")
def max_len_bool(d, ctx):
    edits.edit(d, lambda m: m.update(max_sequence_length=True))


@edits.case(ArtifactError, r"'backbone\.config' must be an object")
def backbone_config_list(d, ctx):
    edits.edit(d, lambda m: m["backbone"].update(config=[]))


@edits.case(ArtifactError, r"'backbone\.registered_name' must be a string")
def registered_name_int(d, ctx):
    edits.edit(d, lambda m: m["backbone"].update(registered_name=5))


@edits.case(ArtifactError, r"non-standard constant NaN")
def nan_in_config(d, ctx):
    edits.raw_manifest(
        d, lambda b: b.replace(b'"layer_norm_epsilon": ', b'"layer_norm_epsilon": NaN, "x": ')
    )


@edits.case(ArtifactError, r"duplicate key 'dtype'")
def duplicate_keys(d, ctx):
    edits.raw_manifest(d, lambda b: b.replace(b'"dtype": "float32"', b'"dtype": "float32", "dtype": "int8"', 1))


@edits.case(ArtifactError, r"manifest\.json is not UTF-8")
def non_utf8_manifest(d, ctx):
    edits.raw_manifest(d, lambda b: b.replace(b'"created": "', b'"created": "\xff\xfe'))


@edits.case(ArtifactError, r"nested too deeply")
def deeply_nested_config(d, ctx):
    deep = 0
    for _ in range(40):
        deep = [deep]
    edits.edit(d, lambda m: m["preprocessor"]["config"].update(extra=deep))


@edits.case(ArtifactError, r"manifest\.json is not valid JSON")
def recursion_bomb(d, ctx):
    edits.raw_manifest(
        d, lambda b: b.replace(b'"created": ', b'"x": ' + b"[" * 200_000 + b"]" * 200_000 + b', "created": ')
    )


@edits.case(ArtifactError, r"'backbone\.config\.name' is too long")
def huge_string(d, ctx):
    edits.edit(d, lambda m: m["backbone"]["config"].update(name="x" * 200_000))


@edits.case(ArtifactError, r"'preprocessor\.config\.extra' is too long")
def huge_list(d, ctx):
    edits.edit(d, lambda m: m["preprocessor"]["config"].update(extra=[0] * 20_000))


@edits.case(ArtifactError, r"sha256 is not a hex SHA-256")
def sha_not_hex(d, ctx):
    edits.edit(d, lambda m: m["files"][fmt.GOLDEN_FILE].update(sha256="z" * 64))


@edits.case(ArtifactError, r"bytes is negative")
def negative_file_size(d, ctx):
    edits.edit(d, lambda m: m["files"][fmt.GOLDEN_FILE].update(bytes=-1))


@edits.case(ArtifactError, r"'tokenizer\.golden' must be a list")
def tokenizer_golden_string(d, ctx):
    edits.edit(d, lambda m: m["tokenizer"].update(golden="x"))


@edits.case(ArtifactError, r"tokenizer\.start_token_id' is 1e\+30|'tokenizer\.start_token_id' is")
def tokenizer_float_token_id(d, ctx):
    edits.edit(d, lambda m: m["tokenizer"].update(start_token_id=1e30))


# --------------------------------------------------------------------------
# Swapped tokenizer assets.
# --------------------------------------------------------------------------


@edits.case(IntegrityError, r"tokenizer fingerprint")
def swapped_tokenizer_rehashed(d, ctx):
    shutil.copy(edits.foreign_spm(ctx["out_dir"]), edits.asset(d))
    edits.rehash_files(d)


def _swap_and_refingerprint(d, spm):
    shutil.copy(spm, edits.asset(d))
    edits.rehash_files(d)
    m = edits.read_manifest(d)
    m["tokenizer"]["fingerprint"] = edits.fingerprint(m)
    edits.write_manifest(d, m)


@edits.case(ArtifactError, r"tokenizer assets could not be loaded.*Cannot find special token")
def swapped_tokenizer_refingerprinted(d, ctx):
    # Gemma's SentencePiece model lacks Llama's special tokens.
    _swap_and_refingerprint(d, edits.foreign_spm(ctx["out_dir"]))


@edits.case(IntegrityError, r"does not reproduce the token ids")
def swapped_tokenizer_same_family(d, ctx):
    # Another Llama tokenizer: it loads, but tokenizes differently.
    _swap_and_refingerprint(d, edits.foreign_spm(ctx["out_dir"], "llama", 320))


# Llama's config names a key GPT2Tokenizer does not take; with a config it
# takes, the preprocessor check refuses it (`tests/export/test_pairings.py`).
@edits.case(ArtifactError, r"tokenizer config has '\w+', which GPT2Tokenizer does not take")
def swapped_tokenizer_class(d, ctx):
    def fn(t):
        t.update(
            class_name="GPT2Tokenizer",
            registered_name="keras_hub>GPT2Tokenizer",
            module="keras_hub.src.models.gpt2.gpt2_tokenizer",
        )

    edits.edit_json(d, fmt.TOKENIZER_CONFIG_FILE, fn, rehash=False)
    m = edits.read_manifest(d)
    fn(m["tokenizer"])
    edits.write_manifest(d, m)
    edits.rehash_files(d)


# --------------------------------------------------------------------------
# Config and manifest that disagree.
# --------------------------------------------------------------------------


@edits.case(ArtifactError, r"'hidden_size' is 128 in config\.json but 64")
def config_json_hidden_disagrees(d, ctx):
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(hidden_size=128))


@edits.case(ArtifactError, r"'num_hidden_layers' is 3 in config\.json but 2")
def config_json_layers_disagree(d, ctx):
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(num_hidden_layers=3))


@edits.case(ArtifactError, r"'vocab_size' is 100000 in config\.json")
def config_json_vocab_disagrees(d, ctx):
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(vocab_size=100000))


@edits.case(ArtifactError, r"'max_position_embeddings' is 1000000 in config\.json")
def config_json_positions_disagree(d, ctx):
    edits.edit_json(
        d, fmt.CONFIG_FILE, lambda c: c.update(max_position_embeddings=1000000)
    )


@edits.case(ArtifactError, r"tokenizer/config\.json and the manifest's tokenizer section")
def tokenizer_config_disagrees(d, ctx):
    edits.edit_json(
        d,
        fmt.TOKENIZER_CONFIG_FILE,
        lambda t: t["config"].update(add_bos=True),
    )


@edits.case(ArtifactError, r"checkpoint and the manifest list different variables")
def manifest_drops_variable(d, ctx):
    def fn(m):
        del m["weights"]["variables"][edits.first_var(m)]
        m["weights"]["total_variables"] -= 1

    edits.edit(d, fn)


@edits.case(ArtifactError, r"'stop_token_ids' is 999999, not a token id")
def stop_id_beyond_vocabulary(d, ctx):
    edits.edit(d, lambda m: m.update(stop_token_ids=[999999]))
    edits.edit_json(d, fmt.CONFIG_FILE, lambda c: c.update(eos_token_id=[999999]))


@edits.case(ArtifactError, r"golden\.json must be an object with 'max_new_tokens'")
def golden_malformed(d, ctx):
    edits.edit_json(d, fmt.GOLDEN_FILE, lambda g: {"outputs": "x"})


@edits.case(ArtifactError, r"golden\.json: 'output_ids' is a, not a token id")
def golden_ids_strings(d, ctx):
    edits.edit_json(
        d, fmt.GOLDEN_FILE, lambda g: g["outputs"][0].update(output_ids=["a"])
    )


@edits.case(ArtifactError, r"generation_config\.json: 'temperature' has the wrong type")
def generation_config_type(d, ctx):
    edits.edit_json(
        d, fmt.GENERATION_CONFIG_FILE, lambda g: g.update(temperature="hot")
    )


@edits.case(ArtifactError, r"'top_p' is 5")
def generation_config_range(d, ctx):
    edits.edit_json(d, fmt.GENERATION_CONFIG_FILE, lambda g: g.update(top_p=5))


@edits.case(ArtifactError, r"generation_config\.json has the field 'logits_processors'")
def generation_config_extra(d, ctx):
    edits.edit_json(
        d,
        fmt.GENERATION_CONFIG_FILE,
        lambda g: g.update(logits_processors=["evil.Processor"]),
    )


@edits.case(ArtifactError, r"chat_template\.jinja is not UTF-8")
def chat_template_binary(d, ctx):
    with open(os.path.join(d, fmt.CHAT_TEMPLATE_FILE), "wb") as f:
        f.write(b"\xff\xfe{{ evil }}")
    edits.rehash_files(d)


@edits.case(ArtifactError, r"'weights\.mode' is 'preset' but the artifact has 'weights/'")
def preset_mode_with_weight_files(d, ctx):
    def fn(m):
        m["weights"].update(mode="preset", variables={})
        m["preset"] = {
            "handle": "/nonexistent/preset",
            "files": {"config.json": edits.ZERO_SHA, "model.weights.h5": edits.ZERO_SHA},
        }

    edits.edit(d, fn)


@edits.case(ArtifactError, r"'weights\.directory' must be 'weights'")
def weights_directory_elsewhere(d, ctx):
    edits.edit(d, lambda m: m["weights"].update(directory="../elsewhere"))


@edits.case(PresetUnavailableError, r"/nonexistent/tiny_llama_preset.*(offline|weights='full')")
def delta_preset_unavailable(d, ctx):
    def fn(m):
        m["weights"]["mode"] = "delta"
        m["preset"] = {
            "handle": "/nonexistent/tiny_llama_preset",
            "files": {"config.json": edits.ZERO_SHA, "model.weights.h5": edits.ZERO_SHA},
        }

    edits.edit(d, fn)


@edits.case(ArtifactError, r"backbone config has 'evil_hook', which LlamaBackbone does not take")
def backbone_config_unknown_argument(d, ctx):
    edits.edit(d, lambda m: m["backbone"]["config"].update(evil_hook="os.system"))


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

        edits.edit(d, fn)

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
    edits.case(ArtifactError, _fragment)(_fn)


@edits.case(ArtifactError, r"module 'os' is not a keras-hub module")
def class_module_field(d, ctx):
    edits.edit(d, lambda m: m["backbone"].update(module="os"))


# --------------------------------------------------------------------------
# Version skew.
# --------------------------------------------------------------------------


@edits.case(VersionSkewError, r"format version 2\.0.*Upgrade keras-vllm")
def newer_format_major(d, ctx):
    edits.edit(d, lambda m: m.update(format_version=[2, 0]))


@edits.case(VersionSkewError, r"format version 0\.9.*Re-export")
def older_format_major(d, ctx):
    edits.edit(d, lambda m: m.update(format_version=[0, 9]))


@edits.case(VersionSkewError, r"keras-hub 7\.1\.0.*keras-hub 7\.x")
def other_keras_hub_major(d, ctx):
    edits.edit(d, lambda m: m["written_by"].update(keras_hub="7.1.0"))


@edits.case(ArtifactError, r"'format' must be 'keras_vllm'")
def other_format(d, ctx):
    edits.edit(d, lambda m: m.update(format="safetensors"))
