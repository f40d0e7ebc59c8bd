"""The shared step of the tiny vision-language fixtures (`vision_models`,
`gemma4_vision_models`, `qwen3_5_vision`): a backbone built with a vision
encoder takes the trained text model's decoder weights."""


def copy_text_weights(text_backbone, backbone):
    """Assigns every variable of `text_backbone` to the variable of
    `backbone` at the same place (the vision backbone holds the text one's
    variables in the same order, with the encoder's in between).

    Raises:
        AssertionError: some text variable has no counterpart.
    """
    from keras_vllm.hub import weights as weight_io

    text_vars = weight_io.ordered_variables(text_backbone)
    position = 0
    for variable in weight_io.ordered_variables(backbone):
        source = text_vars[position] if position < len(text_vars) else None
        if source is not None and weight_io.canonical_path(
            source.path
        ) == weight_io.canonical_path(variable.path):
            variable.assign(source.value)
            position += 1
    assert position == len(text_vars), "a text variable was not copied"
