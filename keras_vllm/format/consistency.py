"""Cross-file consistency of an opened artifact (plain Python).

`keras_vllm.format.open_artifact` checks the manifest's own structure and
every file's checksum. `validate_artifact` checks what the files say
against each other: class names and config bounds, the parameter count,
`config.json`, `generation_config.json`, `golden.json`, the tokenizer files
and the orbax tree metadata against the manifest, and the keras-hub version
that wrote the  It imports neither JAX, Keras nor vLLM, so the
engine runs it before vLLM starts and `load_causal_lm` before building
anything.
"""

import re

from keras_vllm.errors import IntegrityError
from keras_vllm.format import configs
from keras_vllm.format import golden_images
from keras_vllm.format import references
from keras_vllm.format import vllm_files
from keras_vllm.format import weight_tree
from keras_vllm.format.checks import check_id_list
from keras_vllm.format.checks import check_token_id
from keras_vllm.format.checks import fail
from keras_vllm.format.checks import is_int
from keras_vllm.format.files import read_bytes
from keras_vllm.format.manifest import tokenizer_fingerprint
from keras_vllm.format.names import CHAT_TEMPLATE_FILE
from keras_vllm.format.names import CONFIG_FILE
from keras_vllm.format.names import GENERATION_CONFIG_FILE
from keras_vllm.format.names import GOLDEN_FILE
from keras_vllm.format.names import GOLDEN_IMAGES_FILE
from keras_vllm.format.names import MAX_CHAT_TEMPLATE_BYTES
from keras_vllm.format.names import MAX_GOLDEN_RECORDS
from keras_vllm.format.names import MAX_GOLDEN_STEPS
from keras_vllm.format.names import MAX_PROBE_CHARS
from keras_vllm.format.names import TOKENIZER_ASSETS_DIR
from keras_vllm.format.names import TOKENIZER_CONFIG_FILE
from keras_vllm.format.names import WEIGHTS_DIR

# The files of an orbax (OCDBT) PyTree checkpoint.
_WEIGHT_FILE = re.compile(
    r"(_METADATA|_CHECKPOINT_METADATA|_sharding|commit_success\.txt"
    r"|descriptor/descriptor\.pbtxt|array_metadatas/process_\d{1,6}"
    r"|(ocdbt\.process_\d{1,6}/)?(manifest\.ocdbt|d/[0-9a-f]{32}))"
)

_TEMPLATE_REFERENCE = re.compile(
    r"\{%[-+]?\s*(include|import|from|extends)\b"
)

_ASSET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


def _check_required_files(manifest):
    files = manifest["files"]
    mode = manifest["weights"]["mode"]
    required = [
        GENERATION_CONFIG_FILE,
        GOLDEN_FILE,
        TOKENIZER_CONFIG_FILE,
    ]
    if manifest.get("servable", True):
        required.append(CONFIG_FILE)
    for rel in required:
        if rel not in files:
            raise IntegrityError(
                f"Artifact file '{rel}' is missing from the manifest. The "
                "artifact is incomplete; re-export the model."
            )
    top_level = {
        CONFIG_FILE,
        GENERATION_CONFIG_FILE,
        GOLDEN_FILE,
        CHAT_TEMPLATE_FILE,
        TOKENIZER_CONFIG_FILE,
        GOLDEN_IMAGES_FILE,
    }
    has_weights = False
    for rel in files:
        if rel.startswith(WEIGHTS_DIR + "/"):
            has_weights = True
            if _WEIGHT_FILE.fullmatch(rel[len(WEIGHTS_DIR) + 1 :]) is None:
                fail(
                    f"The artifact holds '{rel[:200]}', which is not a file "
                    "an orbax checkpoint consists of. Remove it, or re-export "
                    "the model."
                )
        elif rel in top_level or golden_images.is_image_file(rel) or (
            rel.startswith(TOKENIZER_ASSETS_DIR + "/")
            and rel.count("/") == 2
        ):
            pass
        else:
            fail(
                f"The artifact holds '{rel[:200]}', which is not part of the "
                "keras-vllm format. Remove it, or re-export the model."
            )
    if has_weights != (mode != "preset"):
        fail(
            f"Invalid manifest: 'weights.mode' is '{mode}' but the artifact "
            + ("has" if has_weights else "has no")
            + f" '{WEIGHTS_DIR}/' files."
        )


def _check_tokenizer(manifest, vocab):
    section = manifest["tokenizer"]
    files = manifest["files"]
    names = section.get("assets")
    if not isinstance(names, list) or len(names) > 100:
        fail("Invalid manifest: 'tokenizer.assets' must be a list of names.")
    for name in names:
        if not isinstance(name, str) or _ASSET_NAME.fullmatch(name) is None:
            fail(
                f"Invalid manifest: tokenizer asset {str(name)[:100]!r} is not "
                "a plain file name."
            )
    prefix = TOKENIZER_ASSETS_DIR + "/"
    on_disk = sorted(r[len(prefix):] for r in files if r.startswith(prefix))
    if sorted(names) != on_disk or len(set(names)) != len(names):
        fail(
            "The tokenizer assets on disk differ from those the manifest "
            f"lists ({on_disk[:10]} vs {sorted(map(str, names))[:10]})."
        )
    fingerprint = section.get("fingerprint")
    if fingerprint is not None:
        digests = {name: files[prefix + name]["sha256"] for name in names}
        if tokenizer_fingerprint(digests, section["config"]) != fingerprint:
            raise IntegrityError(
                "The tokenizer assets or config do not match the tokenizer "
                "fingerprint recorded at export; they do not belong to this "
                "model. Re-export it."
            )
    for key in ("start_token_id", "end_token_id", "pad_token_id"):
        check_token_id(section.get(key), vocab, f"'tokenizer.{key}'")
    probes = section.get("golden", [])
    if not isinstance(probes, list) or len(probes) > MAX_GOLDEN_RECORDS:
        fail("Invalid manifest: 'tokenizer.golden' must be a list.")
    # Every tokenizer load (one per vLLM front-end process) replays them.
    chars = sum(
        len(p["text"]) for p in probes
        if isinstance(p, dict) and isinstance(p.get("text"), str)
    )
    if chars > MAX_PROBE_CHARS:
        fail(
            f"Invalid manifest: 'tokenizer.golden' holds {chars} characters "
            f"of probe text, more than the {MAX_PROBE_CHARS} allowed."
        )
    for probe in probes:
        if not (
            isinstance(probe, dict)
            and isinstance(probe.get("text"), str)
            and len(probe["text"]) < 100_000
        ):
            fail("Invalid manifest: a 'tokenizer.golden' entry is malformed.")
        check_id_list(probe.get("ids"), vocab, "'tokenizer.golden[].ids'")


def _check_golden(read, manifest, vocab):
    what = GOLDEN_FILE
    golden = read(what)
    if not isinstance(golden, dict) or set(golden) != {
        "max_new_tokens",
        "outputs",
    }:
        fail(
            f"{what} must be an object with 'max_new_tokens' and 'outputs'; "
            "re-export the model."
        )
    steps = golden["max_new_tokens"]
    served = manifest["max_sequence_length"]
    if not (is_int(steps) and 0 <= steps <= served):
        fail(
            f"{what}: 'max_new_tokens' is {str(steps)[:50]}, not between 0 "
            f"and the served sequence length {served} "
            "('max_sequence_length'); re-export the model."
        )
    outputs = golden["outputs"]
    if not isinstance(outputs, list) or len(outputs) > MAX_GOLDEN_RECORDS:
        fail(f"{what}: 'outputs' must be a list of records.")
    if len(outputs) * steps > MAX_GOLDEN_STEPS:
        fail(
            f"{what}: {len(outputs)} records of {steps} new tokens are more "
            f"than the {MAX_GOLDEN_STEPS} decoding steps `verify` spends; "
            "re-export the model with fewer golden prompts or tokens."
        )
    for record in outputs:
        if not isinstance(record, dict) or not isinstance(
            record.get("prompt"), str
        ):
            fail(f"{what}: a record is malformed (needs a string 'prompt').")
        check_id_list(record.get("prompt_ids"), vocab, f"{what}: 'prompt_ids'")
        check_id_list(record.get("output_ids"), vocab, f"{what}: 'output_ids'")
        if len(record["output_ids"]) > steps:
            fail(f"{what}: a record has more output ids than 'max_new_tokens'.")
        if len(record["prompt_ids"]) + steps > served:
            fail(
                f"{what}: a prompt of {len(record['prompt_ids'])} ids plus "
                f"{steps} new tokens exceeds the served sequence length "
                f"{served}; re-export the model."
            )


def _check_tokenizer_config(read, manifest):
    what = TOKENIZER_CONFIG_FILE
    stored = read(what)
    section = manifest["tokenizer"]
    if not isinstance(stored, dict) or any(
        stored.get(key) != section.get(key)
        for key in ("class_name", "registered_name", "module", "config")
    ):
        fail(
            f"{what} and the manifest's tokenizer section disagree. One of "
            "them was altered; re-export the model."
        )


def _check_chat_template(artifact):
    manifest = artifact.manifest
    rel = CHAT_TEMPLATE_FILE
    if rel not in manifest["files"]:
        return
    if manifest["files"][rel]["bytes"] > MAX_CHAT_TEMPLATE_BYTES:
        fail(f"{rel} is larger than {MAX_CHAT_TEMPLATE_BYTES} bytes.")
    data = read_bytes(artifact.file(rel), MAX_CHAT_TEMPLATE_BYTES, rel)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{rel} is not UTF-8 text; re-export the model.")
    match = _TEMPLATE_REFERENCE.search(text)
    if match is not None:
        # Chat templates render without a loader: a reference to another
        # template is either broken or an attempt to reach a file.
        fail(
            f"{rel} uses '{{% {match.group(1)} %}}', a reference to another "
            "template; chat templates of an artifact are self-contained. "
            "Inline it and re-export the model."
        )


def validate_artifact(artifact):
    """Cross-checks an opened artifact's files and manifest (plain Python).

    `keras_vllm.format.Artifact.validate()` runs this once per opened
    artifact; the JSON files are read through the artifact, which hashes
    them as it reads them.

    Args:
        artifact: the opened `keras_vllm.format.Artifact`.

    Returns:
        The artifact's manifest.

    Raises:
        ArtifactError: (or a subclass) naming what is inconsistent, out of
            bounds or off the allowlist, and what to do.
    """
    manifest, read = artifact.manifest, artifact.read_json
    configs.check_version_skew(manifest)
    for role in configs.ROLE_SUFFIX:
        section = manifest[role]
        configs.check_class_name(section, role)
        configs.check_config_values(section["config"], f"{role}.config")
    for role in ("tokenizer", "preprocessor", "sampler", "causal_lm"):
        references.check_asset_fields(
            manifest[role]["config"], f"{role}.config"
        )
        references.check_config_file_field(
            manifest[role]["config"], role, f"{role}.config"
        )
    references.check_asset_fields(
        manifest["backbone"]["config"], "backbone.config"
    )
    references.check_preset_reference(
        manifest.get("preset"), manifest["weights"]["mode"]
    )
    configs.check_parameter_count(manifest)
    weight_tree.check_variable_index(manifest)
    weight_tree.check_config_against_weights(
        manifest, configs.estimate_parameters(manifest["backbone"]["config"])
    )
    vocab = configs.size(manifest["backbone"]["config"], "vocabulary_size")
    if not is_int(vocab) or vocab <= 0:
        fail(
            "Invalid manifest: 'backbone.config.vocabulary_size' must be a "
            "positive integer."
        )
    check_id_list(manifest["stop_token_ids"], vocab, "'stop_token_ids'", 1000)
    _check_required_files(manifest)
    _check_tokenizer(manifest, vocab)
    _check_tokenizer_config(read, manifest)
    if CONFIG_FILE in manifest["files"]:
        vllm_files.check_vllm_config(read(CONFIG_FILE), manifest, vocab)
    vllm_files.check_generation_config(
        read(GENERATION_CONFIG_FILE), manifest, vocab
    )
    _check_golden(read, manifest, vocab)
    golden_images.check(read, manifest, vocab)
    _check_chat_template(artifact)
    weight_tree.check_orbax_tree(read, manifest)
    return manifest
