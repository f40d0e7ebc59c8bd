"""Records the golden outputs of image prompts into an export (format 1.11).

Only for a servable artifact that serves images, and only when golden
outputs are recorded at all: the drawn images of `hub.golden_images`, the
prompts that fit the served length, Keras' greedy tokens for each, written
by `format.golden_images` before the export's file table is made (so the
files are listed and checksummed like the rest).
"""

import logging

from keras_vllm import progress
from keras_vllm.export import sections
from keras_vllm.format import golden_images as golden_format
from keras_vllm.hub import golden_images as drawn

logger = logging.getLogger("keras_vllm")


def record(causal_lm, directory, max_new_tokens, stop_token_ids,
           max_sequence_length, as_stored):
    """Writes `golden_images.json` and its images into `directory`.

    Args:
        causal_lm: the model being exported (served, with images).
        directory: the staged artifact directory.
        max_new_tokens: tokens generated per prompt.
        stop_token_ids: ids that end an output.
        max_sequence_length: the artifact's served length.
        as_stored: a context manager factory: the model as the artifact
            stores it (see `sections.golden_alongside`).
    """
    settings = sections.image_settings(causal_lm)
    images = drawn.synthetic_images()
    wanted = []
    for prompt, indices in drawn.image_prompts(settings):
        pixels = [images[i] for i in indices]
        length = drawn.prompt_length(
            causal_lm, prompt, pixels, max_sequence_length
        )
        if length + max_new_tokens <= max_sequence_length:
            wanted.append((prompt, indices, pixels, length))
        else:
            logger.warning(
                "keras-vllm: golden image prompt %r left out: its %d ids "
                "and %d new tokens exceed the served length %d.",
                prompt, length, max_new_tokens, max_sequence_length,
            )
    if not wanted:
        return
    with progress.phase(
        "recording golden image outputs", total=len(wanted), unit="prompts"
    ) as phase, as_stored():
        results = drawn.greedy_with_images(
            causal_lm, [(prompt, pixels) for prompt, _, pixels, _ in wanted],
            max_new_tokens, stop_token_ids, max_sequence_length,
        )
        phase.advance(len(wanted))
    records = [
        {"prompt": prompt, "images": indices, "prompt_ids": prompt_ids,
         "output_ids": output_ids}
        for (prompt, indices, _, _), (prompt_ids, output_ids)
        in zip(wanted, results)
    ]
    golden_format.write_golden_images(
        directory, max_new_tokens, images, records
    )
