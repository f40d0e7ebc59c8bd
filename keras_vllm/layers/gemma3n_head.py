"""Gemma 3n's tied output head, as Keras layers read it live.

`Gemma3nBackbone` keeps its token embedding in its nested text model
(`language_model.embed_tokens`), and the text model's `token_embedding(x,
reverse=True)` multiplies by that table (and soft-caps) directly. Two
readers need it as an object:

- `Gemma3nOutputHead`: the layer `Gemma3nCausalLM`'s functional graph calls
  for its logits (`keras_vllm.layers.gemma3n_fixes`), so that each call
  reads the embedding's current value;
- `Gemma3nTokenEmbedding`: what `backbone.token_embedding` returns, the
  reversible embedding keras-vllm's export checks and served model read
  (`reverse=True` gives the logits).
"""

import keras


def _token_embedding_of(text_model):
    """keras-hub's own `Gemma3nTextModel.token_embedding` (the unpatched
    method: the patched one routes symbolic calls to the output head)."""
    from keras_vllm import patching

    return patching.upstream_of(type(text_model).token_embedding)


class Gemma3nOutputHead(keras.layers.Layer):
    """The logits of a Gemma 3n text model: its `token_embedding(x,
    reverse=True)`, run when the layer is called.

    The text model is tracked here as a shared layer (its variables stay
    the backbone's: Keras lists and saves each variable once).

    Args:
        text_model: the backbone's `Gemma3nTextModel`.

    Example:

    ```python
    head = Gemma3nOutputHead(backbone.language_model, name="output_head")
    logits = head(backbone(inputs))
    ```
    """

    def __init__(self, text_model, **kwargs):
        super().__init__(**kwargs)
        self.text_model = text_model

    def call(self, hidden_states):
        return _token_embedding_of(self.text_model)(
            self.text_model, hidden_states, reverse=True
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (int(self.text_model.vocab_size),)


class Gemma3nTokenEmbedding:
    """A Gemma 3n backbone's token embedding as a reversible embedding.

    Args:
        text_model: the backbone's `Gemma3nTextModel`.

    Example:

    ```python
    logits = backbone.token_embedding(hidden_states, reverse=True)
    ```
    """

    def __init__(self, text_model):
        self.text_model = text_model

    @property
    def embeddings(self):
        """The `[vocabulary, hidden]` embedding table."""
        return self.text_model.embed_tokens.embedding.embeddings

    def call(self, inputs, reverse=False):
        """Scaled embeddings of token ids, or (`reverse=True`) the logits of
        hidden states, soft-capped as the text model caps them."""
        return _token_embedding_of(self.text_model)(
            self.text_model, inputs, reverse=reverse
        )

    __call__ = call
