"""Registers tokenizer mode `keras_vllm` with vLLM."""

from keras_vllm import format as fmt

MODE = fmt.TOKENIZER_MODE
CLASS_NAME = "KerasVllmTokenizer"
# vLLM imports the class by module name when a model asks for the mode; the
# package re-exports it, so the entry point does not follow internal moves.
MODULE = __package__
# The renderer vLLM pairs with the mode. HfRenderer only needs the
# TokenizerLike surface plus `name_or_path` and `get_chat_template`.
RENDERER = ("vllm.renderers.hf", "HfRenderer")


def register():
    """Registers tokenizer mode `keras_vllm` with vLLM (idempotent).

    Two registrations, both required by vLLM 0.32 (the tokenizer mode also
    selects the renderer):

    ```python
    TokenizerRegistry.register(
        "keras_vllm", "keras_vllm.serve.tokenizer", "KerasVllmTokenizer"
    )
    RENDERER_REGISTRY.register("keras_vllm", "vllm.renderers.hf", "HfRenderer")
    ```

    keras-hub's own plugin registers `keras_hub` / `KerasHubTokenizer`;
    the names differ, so both coexist.
    """
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    tokenizer_entry = (MODULE, CLASS_NAME)
    if TokenizerRegistry.tokenizers.get(MODE) != tokenizer_entry:
        TokenizerRegistry.register(MODE, *tokenizer_entry)
    if RENDERER_REGISTRY.renderers.get(MODE) != RENDERER:
        RENDERER_REGISTRY.register(MODE, *RENDERER)
