"""Prompt token ids only an unserved encoder embeds, refused.

An artifact exported with encoders it does not serve (Gemma 3n's vision and
audio towers: `manifest.modalities.unserved_inputs`) is served as its text
decoder, which embeds every id from its text table. The whole Keras model
embeds some ids through an encoder's own embedder instead (the family
registers which: `layers.common.registry.register_encoder_token_ids`), so a
prompt holding one would get other tokens than `generate()` gives. Such a
request is refused before it reaches the engine, naming the ids, from
`KerasVllmEngine.generate` / `chat`, `vllm.LLM` and `vllm serve` alike (a
400 that keeps the server serving).

Patched: `InputProcessor._validate_model_input` (vLLM 0.32.0), where vLLM
checks a prompt's token ids against the served model.
"""

from keras_vllm import format as fmt
from keras_vllm import patching

# Artifact path -> its refused id ranges (read once per process).
_RANGES = {}


def refused_ranges(manifest):
    """The `(start, stop)` id ranges a prompt to this artifact may not hold.

    Args:
        manifest: the artifact's validated manifest.

    Returns:
        A list of half-open ranges (empty for an artifact that serves its
        whole model).
    """
    if not fmt.unserved_inputs(manifest):
        return []
    from keras_vllm.layers import families  # noqa: F401  (registers them)
    from keras_vllm.layers.common import registry
    from keras_vllm.load import rebuild

    backbone_cls, config = rebuild.role_config(manifest, "backbone")
    return registry.encoder_token_ids(backbone_cls, config)


def check(token_ids, ranges):
    """Raises for the ids of `token_ids` inside `ranges`.

    Raises:
        vllm.exceptions.VLLMValidationError: names the ids and why.
    """
    found = sorted({
        int(i) for i in token_ids
        if any(start <= i < stop for start, stop in ranges)
    })
    if not found:
        return
    from vllm.exceptions import VLLMValidationError

    raise VLLMValidationError(
        f"The prompt holds token ids {found[:8]} that the model embeds with "
        "an encoder keras-vllm does not serve (its image or audio "
        "embedder's own vocabulary, ids "
        f"{', '.join(f'{a}-{b - 1}' for a, b in ranges)}); the served text "
        "decoder would embed them as text and generate something else. "
        "Send prompts without them (text, without the image or audio "
        "tokens).",
        parameter="prompt_token_ids",
    )


def _ranges_of(path):
    if path not in _RANGES:
        _RANGES[path] = refused_ranges(fmt.read_manifest(path))
    return _RANGES[path]


def install():
    """Makes vLLM's prompt checks in this process refuse encoder-only ids
    for keras-vllm artifacts (keras-vllm's vLLM plugin calls this in every
    vLLM process)."""
    from vllm.v1.engine.input_processor import InputProcessor

    from keras_vllm.serve.hf_config import serves_artifact

    def refusing(original):
        def _validate_model_input(self, prompt_input, *args, **kwargs):
            if (
                serves_artifact(self.model_config)
                and prompt_input.get("type") != "embeds"
            ):
                ranges = _ranges_of(self.model_config.model)
                if ranges:
                    check(prompt_input.get("prompt_token_ids") or (), ranges)
            return original(self, prompt_input, *args, **kwargs)

        return _validate_model_input

    patching.replace(InputProcessor, "_validate_model_input", refusing)
