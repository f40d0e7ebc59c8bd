"""The `vllm.LLM` settings of an engine over an artifact.

What `KerasVllmEngine.from_export` passes to vLLM before the caller's
overrides (`serving_defaults`), the preset a delta artifact loads from,
and the settings handed to vLLM's engine processes through variables.
"""

import contextlib
import os

from keras_vllm import envs
from keras_vllm import format as fmt
from keras_vllm.errors import ServingError

# vLLM needs room for at least one full sequence; tiny CPU models need far
# less than vLLM's GPU-oriented defaults.
_DEFAULT_MAX_NUM_SEQS = 64
# On a CPU host (tests, laptops) every start compiles one program per token
# bucket (16 ... max_num_batched_tokens) and request bucket (8 ...
# max_num_seqs): 6 x 2 programs here instead of 8 x 4 start in well under
# half the time, and a CPU serves no more requests per step usefully.
_CPU_MAX_NUM_SEQS = 16
_CPU_MAX_NUM_BATCHED_TOKENS = 512


def serving_defaults(path, manifest, overrides):
    """The `vllm.LLM` keyword arguments for an artifact, before overrides.

    Raises:
        ServingError: for settings the artifact cannot serve, before vLLM
            starts (and before its memory profiling run).
    """
    from keras_vllm.cpu import detect
    from keras_vllm.load import tensor_parallel
    from keras_vllm.load.worker_extension import WORKER_EXTENSION

    config_path = fmt.safe_join(path, fmt.CONFIG_FILE)
    if not manifest.get("servable", True) or not os.path.isfile(config_path):
        raise ServingError(
            f"'{path}' cannot be served on vLLM: "
            f"{manifest.get('unservable_reason') or 'it has no config.json'} "
            "(it was exported with `allow_unservable=True`)."
        )
    config = fmt.open_artifact(path, verify=False).read_json(fmt.CONFIG_FILE)
    max_positions = int(config["max_position_embeddings"])
    kwargs = {
        "model": path,
        "tokenizer": path,
        "tokenizer_mode": fmt.TOKENIZER_MODE,
        "dtype": manifest["dtype"],
        "max_model_len": max_positions,
        "max_num_seqs": _DEFAULT_MAX_NUM_SEQS,
        "generation_config": "auto",
        "seed": 0,
        # keras-vllm's worker methods (`KerasVllmEngine.weights_layout()`).
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if detect.is_cpu_host():
        kwargs["max_num_seqs"] = _CPU_MAX_NUM_SEQS
        kwargs["max_num_batched_tokens"] = _CPU_MAX_NUM_BATCHED_TOKENS
    kwargs.update(overrides)
    max_len = kwargs.get("max_model_len")
    if max_len is not None and int(max_len) > max_positions:
        raise ServingError(
            f"max_model_len={max_len} exceeds the {max_positions} positions "
            f"this model was exported for. Use max_model_len <= "
            f"{max_positions}, or re-export with a larger "
            "`max_sequence_length` if the model supports it."
        )
    tensor_parallel.check_tensor_parallel(
        config, kwargs.get("tensor_parallel_size", 1), path
    )
    tensor_parallel.check_data_parallel(kwargs.get("data_parallel_size", 1), path)
    dtype = kwargs.get("dtype")
    if dtype not in (None, "auto") and str(dtype) not in fmt.SUPPORTED_DTYPES:
        raise ServingError(
            f"dtype={dtype!r} cannot serve this artifact; use one of "
            f"{fmt.SUPPORTED_DTYPES}."
        )
    return kwargs


def resolve_preset(preset):
    from keras_vllm import presets

    preset = preset if preset is not None else envs.PRESET.get()
    return None if preset is None else presets.resolve_handle(preset)


@contextlib.contextmanager
def for_engine(settings):
    """Hands settings to vLLM's engine processes through their variables:
    the preset override (`load/vllm_model.py` builds the model from it) and
    the signature policy (every reader there honours it)."""
    previous = {}
    for variable, value in settings.items():
        if value is not None:
            previous[variable] = variable.raw()
            variable.set(value)
    try:
        yield
    finally:
        for variable, value in previous.items():
            if value is None:
                os.environ.pop(variable.name, None)
            else:
                variable.set(value)


def generate_length(manifest):
    """The total length (prompt and new tokens) `CausalLM.generate()` runs
    to by default: the exported preprocessor's `sequence_length`, else the
    artifact's longest sequence."""
    config = manifest.get("preprocessor", {}).get("config", {})
    length = config.get("sequence_length") or manifest.get(
        "max_sequence_length"
    )
    return None if length is None else int(length)


def default_sampling_params(llm, manifest, method, inputs, kwargs):
    """The sampling parameters of a `generate`/`chat` call that passed none:
    the artifact's sampler (`generation_config.json`), and as many new
    tokens as the model's own `generate()` makes by default, up to its
    preprocessor's `sequence_length` in all (at least one), instead of
    vLLM's fixed 16.

    Returns:
        One `SamplingParams`, or a list of one per prompt.
    """
    base = llm.get_default_sampling_params()
    length = generate_length(manifest)
    if length is None:
        return base
    tokenizer = llm.get_tokenizer()
    if method == "chat":
        one = not inputs or isinstance(inputs[0], dict)
        items = [inputs] if one else list(inputs)
        counts = [_chat_length(tokenizer, c, kwargs) for c in items]
    else:
        items = [inputs] if isinstance(inputs, (str, dict)) else list(inputs)
        counts = [_prompt_length(tokenizer, p) for p in items]
    params = []
    for count in counts:
        one = base.clone()
        one.max_tokens = max(length - count, 1)
        params.append(one)
    return params


def _prompt_length(tokenizer, prompt):
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return len(prompt["prompt_token_ids"])
        prompt = prompt.get("prompt", "")
    return len(tokenizer.encode(str(prompt)))


def _chat_length(tokenizer, conversation, kwargs):
    return len(
        tokenizer.apply_chat_template(
            conversation,
            chat_template=kwargs.get("chat_template"),
            add_generation_prompt=kwargs.get("add_generation_prompt", True),
            continue_final_message=kwargs.get("continue_final_message", False),
            tokenize=True,
            **(kwargs.get("chat_template_kwargs") or {}),
        )
    )
