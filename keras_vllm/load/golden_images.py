"""Replays an artifact's golden image prompts (format 1.11) with Keras.

`keras-vllm verify` runs it after the text goldens (`keras_loader.
check_golden`): each recorded prompt with its stored images goes through
the rebuilt model's own preprocessor and `generate()`, which must give the
recorded prompt ids (markers expanded) and new ids.
"""

from keras_vllm.format import golden_images as golden_format
from keras_vllm.hub import golden_images as drawn


def label(record):
    """How a failure names a golden image prompt."""
    count = len(record["images"])
    return f"{record['prompt']} (+{count} image{'s' * (count > 1)})"


def check_golden_images(causal_lm, artifact):
    """Mismatches of the artifact's golden image prompts under `causal_lm`.

    Args:
        causal_lm: the rebuilt model (`load_causal_lm`).
        artifact: an opened, validated `keras_vllm.format.Artifact`.

    Returns:
        A list of `(prompt, expected_ids, actual_ids)`: empty when every
        record is reproduced, or the artifact has none (text-only, or
        older than format 1.11).
    """
    golden = golden_format.read_golden_images(artifact.validate())
    if golden is None:
        return []
    steps, records = golden
    stops = artifact.manifest["stop_token_ids"]
    results = drawn.greedy_with_images(
        causal_lm, [(r["prompt"], r["pixels"]) for r in records], steps,
        stops, artifact.manifest["max_sequence_length"],
    )
    failures = []
    for record, (prompt_ids, output_ids) in zip(records, results):
        if prompt_ids != record["prompt_ids"]:
            failures.append(
                (label(record) + " prompt ids", record["prompt_ids"],
                 prompt_ids)
            )
        elif output_ids != record["output_ids"]:
            failures.append((label(record), record["output_ids"], output_ids))
    return failures
