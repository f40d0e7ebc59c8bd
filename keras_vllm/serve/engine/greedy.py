"""Greedy continuations from a running engine, as token ids.

What a caller that compares served output with Keras' `generate()` needs
(`keras-vllm demo`), without importing vLLM itself: vLLM's sampling
parameters stay inside `keras_vllm.serve`.
"""


def greedy_continuations(engine, prompts, max_new_tokens):
    """Serves `prompts` greedily for exactly `max_new_tokens` tokens each.

    End-of-sequence tokens do not stop a request, so every continuation is
    `max_new_tokens` long and can be compared position by position with
    `CausalLM.generate()`'s.

    Args:
        engine: a running `keras_vllm.KerasVllmEngine`.
        prompts: a list of strings.
        max_new_tokens: int, the tokens generated per prompt.

    Returns:
        A list of `(text, token_ids)`, one per prompt, in order.

    Example:

    ```python
    with keras_vllm.KerasVllmEngine.from_export("out/") as engine:
        (text, ids), = greedy_continuations(engine, ["The quick"], 8)
    ```
    """
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True
    )
    outputs = engine.generate(list(prompts), params, use_tqdm=False)
    return [
        (output.outputs[0].text, list(output.outputs[0].token_ids))
        for output in outputs
    ]
