"""The built-in golden images and Keras' greedy tokens for prompts with them.

An export of a model that serves images records a few image prompts' greedy
outputs (`keras_vllm.format.golden_images`); `keras-vllm verify` replays
them. The images are drawn here by code (gradients, a checkerboard, a disc,
stripes: deterministic, a few hundred pixels each, no file shipped or
downloaded), of sizes other than the encoder's so the converter's resize
runs. The prompts write the artifact's own image marker, so this works for
any family whose preprocessor takes `{"prompts", "images"}`.
"""

import numpy as np

# (height, width) of each drawn image. The last two share a size: KerasHub
# zero-pads one prompt's images to the largest before resizing, keras-vllm
# converts each alone (docs/FORMAT.md), so images of one prompt match.
_SIZES = ((20, 24), (30, 18), (12, 28), (12, 28))


def synthetic_images():
    """The golden images: a list of uint8 `(height, width, 3)` arrays.

    Example:

    ```python
    [image.shape for image in synthetic_images()]
    # [(20, 24, 3), (30, 18, 3), (12, 28, 3), (12, 28, 3)]
    ```
    """
    images = []
    for index, (height, width) in enumerate(_SIZES):
        y, x = np.mgrid[0:height, 0:width].astype("float32")
        u, v = y / max(height - 1, 1), x / max(width - 1, 1)
        if index == 0:  # a red-to-blue gradient, green down the rows
            rgb = (255 * (1 - v), 255 * u, 255 * v)
        elif index == 1:  # a checkerboard of 6-pixel squares
            on = ((y // 6 + x // 6) % 2) * 255
            rgb = (on, 255 - on, np.full_like(on, 128))
        elif index == 2:  # a bright disc on a dark ground
            inside = ((u - 0.5) ** 2 + (v - 0.5) ** 2 < 0.12) * 255
            rgb = (inside, inside * 0.8, 40 + inside * 0)
        else:  # diagonal stripes
            on = ((y + x) // 4 % 2) * 255
            rgb = (on * 0.2, on, 255 - on)
        images.append(np.clip(np.stack(rgb, -1), 0, 255).astype("uint8"))
    return images


def as_array(image):
    """A uint8 `(height, width, 3)` array of a golden image as the format
    reads it (`(height, width, rgb bytes)`)."""
    height, width, rgb = image
    return np.frombuffer(rgb, dtype="uint8").reshape(height, width, 3)


def image_prompts(settings):
    """`(prompt, image indices)` pairs for the artifact's image settings:
    one image, another one, and two when the model takes two."""
    marker = settings["marker"]
    prompts = [(f"{marker} shows", [0]), (f"what is in {marker}? it is", [1])]
    if settings["max_images_per_prompt"] >= 2:
        prompts.append((f"{marker} and {marker} are", [2, 3]))
    return prompts


def greedy_with_images(
    causal_lm, cases, max_new_tokens, stop_token_ids, max_sequence_length
):
    """Keras' greedy new tokens for prompts with images.

    The preprocessor expands the markers and converts the images, then the
    model's own `generate()` runs with a greedy sampler, every prompt padded
    to one length (the longest prompt's ids plus `max_new_tokens`), so
    prompts with as many images share one compiled program; the compiled
    greedy function is kept with the model for the next call A family
    whose `generate()` is not its forward pass on images (its image model's
    `generate_is_exact = False`) is decoded by the forward pass instead.

    Args:
        causal_lm: a vision-language `CausalLM` whose preprocessor takes
            `{"prompts", "images"}`.
        cases: `(prompt, images)` pairs: the text with one image marker per
            image, and `(height, width, 3)` arrays (values 0-255).
        max_new_tokens: how many tokens to generate at most.
        stop_token_ids: ids that end an output (included in it).
        max_sequence_length: the longest padded length to run at.

    Returns:
        One `(prompt_ids, new_ids)` per case: the preprocessed prompt's ids
        and the new ones, up to `max_new_tokens` and the first stop id.
    """
    lengths = [
        prompt_length(causal_lm, prompt, images, max_sequence_length)
        for prompt, images in cases
    ]
    length = min(max(lengths, default=0) + max_new_tokens,
                 max_sequence_length)
    from keras_vllm.layers.common.image_inputs import image_model

    family = image_model(type(causal_lm.backbone))
    greedy = (
        _greedy if getattr(family, "generate_is_exact", True)
        else _forward_greedy
    )
    return [
        greedy(causal_lm, prompt, images, max_new_tokens, stop_token_ids,
                length)
        for prompt, images in cases
    ]


# The attribute keeping a model's greedy generate function (its programs,
# one per input shape, are reused by the next replay on the same model; a
# weak map would not do: the function holds the model).
_GREEDY_ATTRIBUTE = "_keras_vllm_greedy_generate"


def _greedy(causal_lm, prompt, images, max_new_tokens, stop_token_ids,
            sequence_length):
    import keras_hub

    preprocessor = causal_lm.preprocessor
    x = _preprocess(preprocessor, prompt, images, sequence_length)
    mask = np.asarray(x["padding_mask"])[0]
    prompt_ids = np.asarray(x["token_ids"])[0][mask].tolist()
    stops = tuple(stop_token_ids) if stop_token_ids else None
    saved = (causal_lm.sampler, causal_lm.generate_function, preprocessor)
    causal_lm.sampler = keras_hub.samplers.GreedySampler()
    causal_lm.generate_function = getattr(causal_lm, _GREEDY_ATTRIBUTE, None)
    causal_lm.preprocessor = None
    try:
        out = causal_lm.generate(x, stop_token_ids=stops)
        setattr(causal_lm, _GREEDY_ATTRIBUTE, causal_lm.generate_function)
    finally:
        (causal_lm.sampler, causal_lm.generate_function,
         causal_lm.preprocessor) = saved
    ids = np.asarray(out["token_ids"])[0].tolist()
    kept = np.asarray(out["padding_mask"])[0].tolist()
    new = []
    for token, keep in zip(ids[len(prompt_ids):], kept[len(prompt_ids):]):
        if not keep or len(new) == max_new_tokens:
            break
        new.append(int(token))
        if stops and token in stops:
            break
    return [int(i) for i in prompt_ids], new


def _forward_greedy(causal_lm, prompt, images, max_new_tokens,
                    stop_token_ids, sequence_length):
    # Greedy decoding by full forward passes, for a family whose cached
    # `generate()` differs from its forward pass on images; padding after
    # the tokens does not change their logits, so each step is one program.
    from keras import ops

    from keras_vllm.hub import compiled_forward

    x = _preprocess(causal_lm.preprocessor, prompt, images, sequence_length)
    names = set(causal_lm.backbone.input)
    x = {k: np.array(v) for k, v in x.items() if k in names}
    count = int(x["padding_mask"][0].sum())
    prompt_ids = [int(i) for i in x["token_ids"][0][:count]]
    stops = set(stop_token_ids or ())
    new = []
    compiled = compiled_forward.compilable(causal_lm)
    for position in range(count, min(count + max_new_tokens,
                                     sequence_length)):
        if compiled:
            (token,) = compiled_forward.argmax_at(
                causal_lm, x, [position - 1]
            )
        else:  # Quantized: eager, as `reference` keeps it.
            logits = causal_lm(x)[0, position - 1]
            token = int(np.argmax(ops.convert_to_numpy(logits)))
        new.append(token)
        if token in stops:
            break
        x["token_ids"][0, position] = token
        x["padding_mask"][0, position] = True
    return prompt_ids, new


def _preprocess(preprocessor, prompt, images, sequence_length):
    return preprocessor.generate_preprocess(
        {
            "prompts": [prompt],
            "images": [[np.asarray(_array(i), "float32") for i in images]],
        },
        sequence_length=sequence_length,
    )


def _array(image):
    return as_array(image) if isinstance(image, tuple) else image


def prompt_length(causal_lm, prompt, images, sequence_length):
    """How many ids the preprocessor makes of `prompt` with `images` (at
    most `sequence_length`)."""
    x = _preprocess(causal_lm.preprocessor, prompt, images, sequence_length)
    return int(np.asarray(x["padding_mask"])[0].sum())
