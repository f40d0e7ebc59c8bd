"""Replays an artifact's golden outputs through a running engine.

`KerasVllmEngine.check_golden` (and so `keras-vllm verify --engine`): the
text prompts of `golden.json` as token ids, then, in an artifact that
serves images (format 1.11), the image prompts of `golden_images.json`
as text with their stored images, through the artifact's multimodal
processor like any request. All go in one batch, greedy, to the recorded
number of tokens and the artifact's stop ids.
"""

from keras_vllm import format as fmt
from keras_vllm.format import golden_images as golden_format
from keras_vllm.hub.golden_images import as_array
from keras_vllm.load.golden_images import label


def check_golden(engine):
    """Mismatches of the artifact's golden outputs served by `engine`.

    Returns:
        A list of `(prompt, expected_ids, served_ids)` (empty when the
        engine reproduces every recorded output).
    """
    from vllm import SamplingParams

    artifact = engine.artifact
    golden = artifact.read_json(fmt.GOLDEN_FILE)
    cases = [
        (record["prompt"], {"prompt_token_ids": record["prompt_ids"]},
         record, golden["max_new_tokens"])
        for record in golden["outputs"]
    ]
    images = golden_format.read_golden_images(artifact.validate())
    if images is not None:
        steps, records = images
        cases += [
            (label(record),
             {"prompt": record["prompt"], "multi_modal_data": {
                 "image": [as_array(p).astype("float32")
                           for p in record["pixels"]]}},
             record, steps)
            for record in records
        ]
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=steps,
            stop_token_ids=engine.manifest["stop_token_ids"],
            skip_special_tokens=False,
        )
        for *_, steps in cases
    ]
    outputs = engine.generate(
        [request for _, request, _, _ in cases], params, use_tqdm=False
    )
    failures = []
    for (name, _, record, _), output in zip(cases, outputs):
        if list(output.prompt_token_ids) != record["prompt_ids"]:
            failures.append((name + " prompt ids", record["prompt_ids"],
                             list(output.prompt_token_ids)))
        elif (served := list(output.outputs[0].token_ids)) != record[
            "output_ids"
        ]:
            failures.append((name, record["output_ids"], served))
    return failures
