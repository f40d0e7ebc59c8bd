"""Which speculative decoding an artifact can be served with.

vLLM takes speculative decoding as `speculative_config` (`vllm.LLM`,
`KerasVllmEngine.from_export`) or `--speculative-config JSON` (also `-sc`,
`--speculative-config.KEY VALUE`, `--spec-method`, `--spec-model`,
`--spec-tokens`) on `vllm serve` and `keras-vllm serve`. tpu-inference 0.32
drafts with n-gram prompt lookup, EAGLE-3, MTP or DFlash. keras-vllm serves
n-gram (model-agnostic) and MTP with a keras-vllm assistant artifact
(`keras_vllm.export_assistant()`: KerasHub's `Gemma4AssistantCausalLM`,
drafting from the target's hidden states over the target's own KV caches;
`serve/hf_config.py`, `serve/worker/assistant_model.py`). Either way the
engine's target model verifies the drafts in one step, and with greedy
sampling the output is the model's own, token for token (drafts only
change how many tokens a step yields).

`check()` refuses, before vLLM starts, what would not run or would change
the output:

- other methods, by name: a separate draft model (`draft_model`), which
  tpu-inference 0.32 does not run; EAGLE/EAGLE-3 and DFlash heads, which
  are tpu-inference's own flax drafters fed with auxiliary hidden states of
  its own model classes (a keras-vllm model returns none); MTP without a
  keras-vllm assistant artifact as `model` (none, the target itself, a
  Hugging Face checkpoint) or with one that does not fit the target
  (`format.assistant.fit_problems`); and the methods tpu-inference does
  not run at all (`medusa`, `mlp_speculator`, `suffix`, `ngram_gpu`,
  `custom_class`, ...);
- drafting (n-gram or MTP) on an artifact whose layers write, for a
  token, something that depends on more than the tokens up to it. A
  verify step runs the drafted tokens through the model, and rejected
  drafts are only harmless where what they wrote is never read: keys
  rotated with factors chosen by the step's sequence length (Phi-3's "su"
  RoPE, the artifact's `prefix_caching: false`) change when the step also
  holds drafts. Keyed on what the artifact declares, not on its family.
  Layers with a recurrent state (`recurrent_state_layers`: Gated DeltaNet)
  absorb every token of a step, and do speculate: while the engine
  speculates they keep a state per draft position in the slots the runner
  gives each request, and the next step reads the last accepted token's
  (`layers/common/gated_delta_rule.py::conv1d_gdn_windowed`; on a TPU in
  place of the GDN Pallas kernel, which tpu-inference 0.32 does not drive
  so);
- drafting on an artifact that serves images: in a step that carries an
  image, placeholder tokens attend to their run both ways, and a run of
  drafted placeholder tokens would too;
- drafting on a data-parallel engine, and MTP with tensor parallelism
  (untested with keras-vllm models).

and what would not be applied or would fail deep in vLLM: n-gram drafting
that steps aside (`serve/worker/draft_schedule.py`) takes vLLM's batch-size
schedule (`num_speculative_tokens_per_batch_size`, checked with vLLM's own
validator; refused with MTP, whose drafter drafts a fixed count) and
keras-vllm's `additional_config={"min_draft_acceptance": RATE}` (a rate from 0
to 1, with n-gram speculation only).

Per request (`keras_vllm.serve.frontend.sampling`): structured outputs on a
speculating engine are refused (tpu-inference 0.32 applies one grammar row
per request, where speculation needs one per drafted token).
"""

import json

from keras_vllm import format as fmt
from keras_vllm.errors import ServingError

# The methods keras-vllm serves (tpu-inference's runner runs them and they
# need nothing from the model but its logits).
SERVED_METHODS = ("ngram", "mtp")

EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4}'
SCHEDULE_EXAMPLE = (
    '{"method": "ngram", "num_speculative_tokens": 4, '
    '"num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 1024, 0]]}'
)
MTP_EXAMPLE = (
    '{"method": "mtp", "model": "exports/tuned_assistant", '
    '"num_speculative_tokens": 3}'
)

_NOT_RUN = (
    "vLLM's TPU backend (tpu-inference 0.32) drafts with ngram, eagle3, "
    "mtp or dflash only"
)
# Why each method vLLM knows cannot serve a keras-vllm artifact.
_WHY_NOT = {
    "draft_model": (
        "a separate draft model is not run by vLLM's TPU backend "
        "(tpu-inference 0.32 drafts with ngram, eagle3, mtp or dflash only)"
    ),
    "eagle": (
        "EAGLE heads are tpu-inference's own flax drafters, fed with "
        "auxiliary hidden states that only its own model classes return (a "
        "keras-vllm model returns none)"
    ),
}
_WHY_NOT["eagle3"] = _WHY_NOT["dflash"] = _WHY_NOT["dspark"] = _WHY_NOT["eagle"]
_WHY_NOT["extract_hidden_states"] = _WHY_NOT["eagle"]


def method_of(config):
    """The method vLLM reads from a speculative config (its own inference
    when `method` is absent: `SpeculativeConfig.__post_init__`, 0.32)."""
    method, model = config.get("method"), config.get("model")
    if method is None:
        if model in ("ngram", "[ngram]"):
            return "ngram"
        if isinstance(model, str) and "/" not in model and "." in model and all(
            part.isidentifier() for part in model.split(".")
        ):
            return "custom_class"
        return None if model is None else "draft_model"
    method = str(method)
    if method == "[ngram]":
        return "ngram"
    if method.endswith("_mtp"):
        return "mtp"
    return method


def check(artifact, kwargs):
    """Refuses a `speculative_config` the artifact cannot be served with.

    Args:
        artifact: the opened `keras_vllm.format.Artifact`.
        kwargs: the `vllm.LLM` keyword arguments, the caller's included
            (`speculative_config`, `data_parallel_size`, ...).

    Raises:
        ServingError: naming the method or the artifact's layers, and what
            would work.

    Example:

    ```python
    check(artifact, {"speculative_config": {"method": "ngram",
                                            "num_speculative_tokens": 4}})
    ```
    """
    config = kwargs.get("speculative_config")
    path = artifact.path
    _check_acceptance_floor(path, config, kwargs)
    if config is None:
        return
    if not isinstance(config, dict):
        raise ServingError(
            f"speculative_config={config!r} cannot serve '{path}': it is a "
            f"dict (JSON on the command line), e.g. {EXAMPLE}."
        )
    method = method_of(config)
    if method is None:
        raise ServingError(
            f"speculative_config={config!r} names no method. keras-vllm "
            f"serves n-gram speculation: {EXAMPLE}, and MTP with an "
            f"assistant artifact: {MTP_EXAMPLE}."
        )
    if method not in SERVED_METHODS:
        why = _WHY_NOT.get(method, f"'{method}' is not one of them: {_NOT_RUN}")
        raise ServingError(
            f"Speculative decoding method '{method}' cannot serve '{path}': "
            f"{why}. keras-vllm serves n-gram (prompt lookup) speculation "
            f"with every artifact whose layers allow it: {EXAMPLE}; MTP with "
            f"a keras-vllm assistant artifact: {MTP_EXAMPLE}; or serve "
            "without speculative_config."
        )
    tokens = config.get("num_speculative_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ServingError(
            f"speculative_config needs 'num_speculative_tokens', the tokens "
            f"drafted per step (a positive integer), e.g. {EXAMPLE}."
        )
    _check_schedule(path, method, config)
    if method == "mtp":
        _check_assistant(artifact, config.get("model"))
        shards = int(kwargs.get("tensor_parallel_size") or 1)
        if shards > 1:
            raise ServingError(
                f"MTP speculation cannot serve '{path}' with "
                f"tensor_parallel_size={shards}: keras-vllm has not verified "
                "its assistant drafting over sharded KV caches. Serve it "
                "with MTP on one device, or with n-gram speculation: "
                f"{EXAMPLE}."
            )
    _check_layers(artifact)
    # Validated by `load.data_parallel.check_data_parallel` already.
    replicas = int(kwargs.get("data_parallel_size") or 1)
    if replicas > 1:
        raise ServingError(
            f"Speculative decoding cannot serve '{path}' with "
            f"data_parallel_size={replicas}: keras-vllm has not verified "
            "tpu-inference 0.32's drafting across data-parallel replicas. "
            "Serve it speculating with data_parallel_size=1, or data-parallel "
            "without speculative_config."
        )


def _check_schedule(path, method, config):
    """Refuses a batch-size schedule keras-vllm would not apply (MTP) or
    vLLM would reject deep in its engine core (a malformed one)."""
    schedule = config.get("num_speculative_tokens_per_batch_size")
    if schedule is None:
        return
    if method != "ngram":
        raise ServingError(
            f"'num_speculative_tokens_per_batch_size' cannot serve '{path}' "
            f"with {method} speculation: keras-vllm drafts by batch size "
            "with n-gram speculation only (its MTP drafter drafts "
            "'num_speculative_tokens' every step). Remove it, or use n-gram, "
            f"e.g. {SCHEDULE_EXAMPLE}."
        )
    from vllm.v1.spec_decode.dynamic import utils

    try:
        utils.validate_and_normalize_dynamic_sd_schedule(schedule)
    except (TypeError, ValueError) as e:
        raise ServingError(
            f"'num_speculative_tokens_per_batch_size' {schedule!r} is not a "
            f"batch-size schedule: {e} It lists [first, last, tokens] "
            f"ranges of the batch size from 1 up, e.g. {SCHEDULE_EXAMPLE}."
        ) from None


def _check_acceptance_floor(path, config, kwargs):
    """Refuses a `min_draft_acceptance` that is not a rate, or that nothing
    would apply (no n-gram speculation)."""
    from keras_vllm.serve.decode_steps import additional_config
    from keras_vllm.serve.worker.draft_schedule import MIN_ACCEPTANCE_KEY

    floor = additional_config(kwargs).get(MIN_ACCEPTANCE_KEY)
    if floor is None:
        return
    example = f'{{"{MIN_ACCEPTANCE_KEY}": 0.3}}'
    if (
        not isinstance(floor, (int, float)) or isinstance(floor, bool)
        or not 0 <= floor <= 1
    ):
        raise ServingError(
            f"additional_config's '{MIN_ACCEPTANCE_KEY}' is {floor!r}: it is "
            "the share of drafted tokens the engine's recent verify steps "
            f"must accept for drafting to go on, a number from 0 to 1, e.g. "
            f"{example}."
        )
    method = None if not isinstance(config, dict) else method_of(config)
    if method != "ngram":
        raise ServingError(
            f"additional_config's '{MIN_ACCEPTANCE_KEY}' cannot serve "
            f"'{path}' without n-gram speculation (speculative_config gives "
            f"{method or 'none'}): keras-vllm applies it to n-gram drafts. "
            f"Remove it, or speculate with n-gram, e.g. {EXAMPLE}."
        )


def _check_assistant(artifact, model):
    """Refuses MTP unless `model` is an assistant artifact that fits."""
    from keras_vllm.errors import KerasVllmError
    from keras_vllm.format import assistant as assistant_format
    from keras_vllm.load.assistant import check_fits

    path = artifact.path
    if not isinstance(model, str) or not assistant_format.is_assistant(model):
        raise ServingError(
            f"MTP speculation on '{path}' drafts with a keras-vllm assistant "
            f"artifact, and speculative_config's 'model' ({model!r}) is "
            "none: export the assistant with "
            "`keras_vllm.export_assistant(assistant, PATH, target=...)` and "
            f"pass its directory, e.g. {MTP_EXAMPLE}, or use n-gram "
            f"speculation: {EXAMPLE}."
        )
    try:
        manifest, _ = assistant_format.read_assistant(model)
    except KerasVllmError as e:
        raise ServingError(
            f"The assistant artifact '{model}' cannot draft for '{path}': "
            f"{e}"
        ) from None
    check_fits(manifest, artifact.read_json(fmt.CONFIG_FILE), path, model)


def _check_layers(artifact):
    # Layers with a recurrent state speculate exactly: they keep a state
    # per draft position while the engine speculates (see the docstring).
    # Their state rules out prefix caching (`prefix_caching: false`),
    # which then says nothing about the attention keys.
    state = artifact.read_json(fmt.CONFIG_FILE).get("recurrent_state_layers")
    why = None
    if "image" in fmt.served_modalities(artifact.manifest):
        why = (
            "it serves images, and in a step that carries an image every "
            "run of image placeholder tokens attends to itself both ways, "
            "drafted placeholders too (`serve/worker/image_model.py`). Its "
            "text decoder alone speculates exactly: re-export it without "
            "an image converter to serve text only"
        )
    elif not state and not fmt.prefix_caching(artifact.manifest):
        why = (
            "its attention keys depend on the sequence's length at the step "
            "that writes them (a rotary embedding whose factors follow the "
            "sequence length), and a verify step also holds the drafted "
            "tokens"
        )
    if why is not None:
        raise ServingError(
            f"Speculative decoding would change what '{artifact.path}' "
            f"generates: {why}. Serve it without speculative_config."
        )


def from_argv(argv):
    """The speculative config a `vllm serve` command line gives, or None.

    Reads `--speculative-config JSON` (`-sc`, `=JSON`; the last one wins),
    `--speculative-config.KEY VALUE` and `--spec-method`, `--spec-model`,
    `--spec-tokens`, as vLLM's parser merges them.

    Raises:
        ServingError: `--speculative-config` is not a JSON object.
    """
    config = None
    names = ("--speculative-config", "-sc")
    for i, arg in enumerate(argv):
        name, _, inline = arg.partition("=")
        value = inline if "=" in arg else (
            argv[i + 1] if i + 1 < len(argv) else None
        )
        if name in names and value is not None:
            config = _json_object(value)
        elif name.partition(".")[0] in names and "." in name and value:
            config = dict(config or {})
            config[name.partition(".")[2].replace("-", "_")] = _scalar(value)
    for flag, key in (
        ("--spec-method", "method"),
        ("--spec-model", "model"),
        ("--spec-tokens", "num_speculative_tokens"),
    ):
        value = _option(argv, flag)
        if value is not None:
            config = dict(config or {})
            config[key] = _scalar(value) if key != "model" else value
    return config


def _option(argv, flag):
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _scalar(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_object(text):
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ServingError(
            f"--speculative-config {text!r} is not a JSON object; use e.g. "
            f"--speculative-config '{EXAMPLE}'."
        )
    return {k.replace("-", "_"): v for k, v in value.items()}
