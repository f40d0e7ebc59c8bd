"""What `KerasVllmEngine.generate` and `chat` sample with when the caller
passes no `SamplingParams`: the artifact's sampler (its
`generation_config.json`) and as many new tokens as the model's own
`CausalLM.generate()` makes, instead of vLLM's fixed 16.
"""


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
