"""Names and limits of the keras-vllm artifact format.

Every file name, vLLM-facing name and bound of the format is declared here
once; the rest of `keras_vllm.format` (and nothing outside it) spells them.
"""

FORMAT_NAME = "keras_vllm"
# The major version changes when a reader of an older version could
# misread an artifact; the minor version when fields are only added.
FORMAT_VERSION = (1, 11)

# vLLM-facing names. Chosen so they cannot collide with keras-hub 0.32's own
# plugin, which registers `keras_hub` / `KerasHubForCausalLM`.
MODEL_TYPE = "keras_vllm"
ARCHITECTURE = "KerasVllmForCausalLM"
# The architecture of an artifact that serves images (format 1.10): vLLM
# finds a model's multimodal processor through its architecture's class.
IMAGE_ARCHITECTURE = "KerasVllmForConditionalGeneration"
TOKENIZER_MODE = "keras_vllm"
# An assistant artifact (a speculative drafter bound to its target:
# `format.assistant`): its manifest's `format` and its config's
# architecture.
ASSISTANT_FORMAT_NAME = "keras_vllm_assistant"
ASSISTANT_ARCHITECTURE = "KerasVllmAssistantForCausalLM"

MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
GOLDEN_FILE = "golden.json"
# Golden outputs of image prompts (format 1.11) and the PNG images they
# read (`format.golden_images`), in an artifact that serves images.
GOLDEN_IMAGES_FILE = "golden_images.json"
GOLDEN_IMAGES_DIR = "golden_images"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_CONFIG_FILE = "tokenizer/config.json"
TOKENIZER_ASSETS_DIR = "tokenizer/assets"
WEIGHTS_DIR = "weights"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# The signature (OpenSSF model-signing's Sigstore bundle; its default name),
# over every other file of the directory, the manifest included. It is the
# one file the manifest's `files` does not list.
SIGNATURE_FILE = "model.sig"

WEIGHT_MODES = ("preset", "delta", "full", "adapter")
# `weights.lora`: factors folded into their kernels, or (adapter artifacts,
# format 1.3) stored beside them as Keras' own `lora_kernel_a`/`_b`.
LORA_STORAGE = ("merged", "factors")
LORA_FACTORS = ("lora_kernel_a", "lora_kernel_b")
# `adapter.factor_dtype`: the dtype the factors are stored in. Absent means
# float32, the dtype Keras trains them in (exact); bfloat16 and float16
# halve an adapter's bytes at the cost of rounding them (opt-in at export).
LORA_FACTOR_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_LORA_FACTOR_DTYPE = "float32"
MAX_LORA_RANK = 4096
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")

# Bounds checked before anything is allocated from a manifest's numbers.
MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_FILE_BYTES = 64 << 20
MAX_DIM = 1 << 24
MAX_ELEMENTS = 1 << 36
MAX_FILES = 100_000
MAX_FILE_BYTES = 1 << 42
# Any integer in a backbone/tokenizer/preprocessor/sampler config above this
# is refused before a layer is built (hostile "huge dimension" manifests).
MAX_CONFIG_INT = 1 << 22
MAX_CONFIG_DEPTH = 16
MAX_CONFIG_STRING = 100_000
MAX_CONFIG_LIST = 10_000
# The largest backbone loaded without asking is `envs.MAX_PARAMETERS.get()`
# (estimated from its config, so a hostile config cannot make the loader
# allocate unbounded memory); this names the variable in messages.
MAX_PARAMETERS_ENV = "KERAS_VLLM_MAX_PARAMETERS"
# The signature lists every file with its digest (bounded by MAX_FILES).
MAX_SIGNATURE_BYTES = 64 << 20
MAX_CHAT_TEMPLATE_BYTES = 1 << 20
MAX_GOLDEN_RECORDS = 1000
MAX_GOLDEN_IDS = 100_000
# Asset and work bounds (docs/FORMAT.md, "Trust"). A vocabulary, merges
# table or SentencePiece proto of a real model is a few MiB (Gemma 3's
# 262k-piece proto is 4.5 MiB); golden.json is a few KiB.
MAX_TOKENIZER_ASSET_BYTES = 64 << 20
MAX_GOLDEN_BYTES = 4 << 20
# Golden images are drawn tiny (`hub.golden_images`); a PNG is a few KiB.
MAX_GOLDEN_IMAGES = 16
MAX_GOLDEN_IMAGE_SIDE = 256
MAX_GOLDEN_IMAGE_BYTES = 1 << 20
# Every JSON file but the manifest and the tokenizer's vocabulary is small.
MAX_SMALL_JSON_BYTES = 1 << 20
# Decoding steps `verify` spends on golden.json (records x max_new_tokens),
# and characters of tokenizer probes every tokenizer load replays.
MAX_GOLDEN_STEPS = 1 << 16
MAX_PROBE_CHARS = 1 << 20

# The preset files a KerasHub backbone's `from_preset` reads: its config,
# and its weights as one file or as an index and the shards it names.
PRESET_CONFIG_FILE = "config.json"
PRESET_WEIGHTS_FILE = "model.weights.h5"
PRESET_SHARDED_INDEX_FILE = "model.weights.json"
PRESET_SHARD_PATTERN = r"model_\d{5,6}\.weights\.h5"
# A Hugging Face (transformers) checkpoint, which keras-hub converts on
# load: the same `config.json` (with `model_type`, no `registered_name`),
# its weights as `model.safetensors` or an index and the shards it names
# (`save_pretrained` writes `model-00001-of-00002.safetensors`).
HF_WEIGHTS_FILE = "model.safetensors"
HF_SHARDED_INDEX_FILE = "model.safetensors.index.json"
HF_SHARD_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,150}(\.[A-Za-z0-9_\-]{1,40}){0,4}\.safetensors"
# Config keys through which keras-hub tokenizers take their assets (a
# string there is a file path keras-hub would open): always null, because
# an artifact's assets are the files in tokenizer/assets/.
ASSET_CONFIG_KEYS = ("proto", "vocabulary", "merges")
# The variable paths of the orbax tree: Keras paths, `/`-separated names.
VARIABLE_PATH_PATTERN = r"[A-Za-z0-9_]{1,200}(/[A-Za-z0-9_]{1,200}){0,31}"

# Every top-level manifest field of format 1.4 (`validate_manifest` refuses
# others unless the artifact declares a newer minor version). 1.1 added
# `golden_reference`, 1.2 `quantization`, 1.3 `adapter` (1.4 only a key
# inside it, `factor_dtype`), 1.6 `modalities`. 1.7 adds no manifest field:
# config.json's per-kind KV cache fields (`format.vllm_files`); 1.8
# `prefix_caching`. 1.9 adds no top-level field: `modalities.image`
# (`format.image_settings`). 1.10 adds no manifest field: config.json's
# recurrent-state layers (`format.state_layers`) and `"image"` in
# `modalities.served` (with its architecture, `IMAGE_ARCHITECTURE`). 1.11
# adds no manifest field: the files `golden_images.json` and
# `golden_images/*.png` (`format.golden_images`).
MANIFEST_FIELDS = (
    "format",
    "format_version",
    "written_by",
    "created",
    "preset",
    "dtype",
    "stop_token_ids",
    "max_sequence_length",
    "sampler_in_vllm",
    "servable",
    "unservable_reason",
    "parameter_count",
    "weights",
    "backbone",
    "causal_lm",
    "tokenizer",
    "preprocessor",
    "sampler",
    "golden_reference",
    "quantization",
    "adapter",
    "modalities",
    "prefix_caching",
    "files",
)
# What a served artifact takes in requests (`manifest.modalities.served`);
# 1.5 and older artifacts serve text; 1.10 adds images.
SERVED_MODALITIES = ("text", "image")
# How golden outputs were computed in Keras (1.0 artifacts: "generate").
GOLDEN_REFERENCES = ("generate", "forward_pass")
