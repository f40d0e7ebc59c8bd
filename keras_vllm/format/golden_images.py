"""Golden outputs of image prompts (format 1.11): `golden_images.json` and
the PNG images it names under `golden_images/`.

`golden.json` replays text prompts. An artifact that serves images also
records, at export, Keras' greedy tokens for a few prompts with images
keras-vllm draws itself (`keras_vllm.hub.golden_images`), so `keras-vllm
verify` can show the Keras rebuild still reads those images as the exported
model did, and `verify --engine` that the served model (its multimodal
processor, vision encoder and image-span attention) does too:

```
golden_images.json
{"max_new_tokens": 16,
 "images": [{"file": "golden_images/0.png", "height": 20, "width": 24}, ...],
 "outputs": [{"prompt": "<start_of_image> shows", "images": [0],
              "prompt_ids": [...], "output_ids": [...]}, ...]}
```

`prompt_ids` are the preprocessor's ids (image markers expanded). Both
files are listed in the manifest with their checksums like every file; the
images are read here, bounded and hashed as they are read, and decoded by
`format.png` (only the PNGs keras-vllm writes).
"""

import hashlib
import os

from keras_vllm.errors import IntegrityError
from keras_vllm.format import png
from keras_vllm.format.checks import check_id_list
from keras_vllm.format.checks import fail
from keras_vllm.format.checks import is_int
from keras_vllm.format.files import read_bytes
from keras_vllm.format.files import safe_join
from keras_vllm.format.files import write_json
from keras_vllm.format.image_settings import image_settings
from keras_vllm.format.names import GOLDEN_IMAGES_DIR
from keras_vllm.format.names import GOLDEN_IMAGES_FILE
from keras_vllm.format.names import MAX_GOLDEN_IMAGE_BYTES
from keras_vllm.format.names import MAX_GOLDEN_IMAGE_SIDE
from keras_vllm.format.names import MAX_GOLDEN_IMAGES
from keras_vllm.format.names import MAX_GOLDEN_RECORDS
from keras_vllm.format.names import MAX_GOLDEN_STEPS
from keras_vllm.format.serving import served_modalities


def image_file(index):
    """The artifact path of golden image `index`."""
    return f"{GOLDEN_IMAGES_DIR}/{index}.png"


def is_image_file(rel):
    """Whether `rel` is a golden image's path (`golden_images/N.png`)."""
    head, _, name = rel.partition("/")
    number = name.removesuffix(".png")
    return (
        head == GOLDEN_IMAGES_DIR and name.endswith(".png")
        and number.isdigit() and name == f"{int(number)}.png"
    )


def has_golden_images(manifest):
    """Whether the artifact records golden outputs of image prompts."""
    return GOLDEN_IMAGES_FILE in manifest["files"]


def check(read, manifest, vocab):
    """Checks `golden_images.json` against the manifest (no-op without it).

    Raises:
        ArtifactError: naming what is malformed.
    """
    what = GOLDEN_IMAGES_FILE
    files = manifest["files"]
    if not has_golden_images(manifest):
        stray = [f for f in files if f.startswith(GOLDEN_IMAGES_DIR + "/")]
        if stray:
            fail(f"'{stray[0][:200]}' is listed but no {what}; re-export.")
        return
    version = tuple(manifest["format_version"])
    if version < (1, 11):
        fail(
            f"{what} is a format 1.11 file, but the artifact declares "
            f"{version[0]}.{version[1]}; re-export the model."
        )
    settings = image_settings(manifest)
    if settings is None or "image" not in served_modalities(manifest):
        fail(f"{what} is in an artifact that serves no image; re-export.")
    golden = read(what)
    if not isinstance(golden, dict) or set(golden) != {
        "max_new_tokens", "images", "outputs",
    }:
        fail(f"{what} must hold 'max_new_tokens', 'images' and 'outputs'.")
    steps, served = golden["max_new_tokens"], manifest["max_sequence_length"]
    if not (is_int(steps) and 0 <= steps <= served):
        fail(f"{what}: 'max_new_tokens' must be between 0 and {served}.")
    images = golden["images"]
    if not isinstance(images, list) or len(images) > MAX_GOLDEN_IMAGES:
        fail(f"{what}: 'images' must be a list of at most "
             f"{MAX_GOLDEN_IMAGES} images.")
    for index, image in enumerate(images):
        if not (
            isinstance(image, dict)
            and set(image) == {"file", "height", "width"}
            and image["file"] == image_file(index)
            and all(
                is_int(image[k]) and 0 < image[k] <= MAX_GOLDEN_IMAGE_SIDE
                for k in ("height", "width")
            )
        ):
            fail(f"{what}: image {index} is malformed.")
        if image["file"] not in files:
            fail(f"{what} names '{image['file']}', which the manifest does "
                 "not list; re-export the model.")
        if files[image["file"]]["bytes"] > MAX_GOLDEN_IMAGE_BYTES:
            fail(f"'{image['file']}' is larger than a golden image may be.")
    named = {image_file(i) for i in range(len(images))}
    stray = [f for f in files
             if f.startswith(GOLDEN_IMAGES_DIR + "/") and f not in named]
    if stray:
        fail(f"'{stray[0][:200]}' is listed but {what} names no such image.")
    outputs = golden["outputs"]
    if not isinstance(outputs, list) or len(outputs) > MAX_GOLDEN_RECORDS:
        fail(f"{what}: 'outputs' must be a list of records.")
    if len(outputs) * steps > MAX_GOLDEN_STEPS:
        fail(f"{what}: more than {MAX_GOLDEN_STEPS} decoding steps.")
    for record in outputs:
        _check_record(record, settings, len(images), steps, served, vocab)


def _check_record(record, settings, image_count, steps, served, vocab):
    what = GOLDEN_IMAGES_FILE
    if not (
        isinstance(record, dict)
        and set(record) == {"prompt", "images", "prompt_ids", "output_ids"}
        and isinstance(record["prompt"], str)
        and len(record["prompt"]) < 10_000
        and isinstance(record["images"], list)
        and all(is_int(i) and 0 <= i < image_count for i in record["images"])
    ):
        fail(f"{what}: a record is malformed.")
    wanted = record["prompt"].count(settings["marker"])
    if not 0 < wanted == len(record["images"]) <= settings[
        "max_images_per_prompt"
    ]:
        fail(f"{what}: a record's image markers and images disagree.")
    check_id_list(record["prompt_ids"], vocab, f"{what}: 'prompt_ids'")
    check_id_list(record["output_ids"], vocab, f"{what}: 'output_ids'")
    if len(record["output_ids"]) > steps:
        fail(f"{what}: a record has more output ids than 'max_new_tokens'.")
    if len(record["prompt_ids"]) + steps > served:
        fail(f"{what}: a record exceeds the served sequence length {served}.")


def read_golden_images(artifact):
    """The image prompts of an opened, validated artifact, with pixels.

    Returns:
        None without `golden_images.json`; else `(max_new_tokens, records)`,
        each record the stored one plus `"pixels"`: its images as
        `(height, width, rgb bytes)` (`hub.golden_images.as_array` makes
        arrays of them).

    Raises:
        ArtifactError / IntegrityError: for an image whose bytes are not
            the ones the manifest lists, or no PNG keras-vllm wrote.
    """
    manifest = artifact.manifest
    if not has_golden_images(manifest):
        return None
    golden = artifact.read_json(GOLDEN_IMAGES_FILE)
    pixels = [_read_image(artifact, image) for image in golden["images"]]
    records = [
        {**record, "pixels": [pixels[i] for i in record["images"]]}
        for record in golden["outputs"]
    ]
    return golden["max_new_tokens"], records


def _read_image(artifact, image):
    rel = image["file"]
    data = read_bytes(
        safe_join(artifact.path, rel), MAX_GOLDEN_IMAGE_BYTES, what=rel
    )
    if hashlib.sha256(data).hexdigest() != artifact.manifest["files"][rel][
        "sha256"
    ]:
        raise IntegrityError(
            f"Checksum mismatch for '{rel}': the golden image was altered "
            "after export. Re-export the model."
        )
    pixels = png.decode(data, MAX_GOLDEN_IMAGE_SIDE, what=rel)
    if pixels[:2] != (image["height"], image["width"]):
        fail(f"'{rel}' is not {image['height']} x {image['width']} pixels.")
    return pixels


def write_golden_images(directory, max_new_tokens, images, records):
    """Writes `golden_images.json` and the PNGs into an export's directory.

    Args:
        directory: the staged artifact directory.
        max_new_tokens: tokens generated per record.
        images: uint8 `(height, width, 3)` arrays (numpy's, used through
            `shape` and `tobytes()`).
        records: dicts with `prompt`, `images` (indices), `prompt_ids` and
            `output_ids`.
    """
    os.makedirs(os.path.join(directory, GOLDEN_IMAGES_DIR), exist_ok=True)
    entries = []
    for index, pixels in enumerate(images):
        height, width = pixels.shape[:2]
        with open(os.path.join(directory, image_file(index)), "wb") as f:
            f.write(png.encode(height, width, pixels.tobytes()))
        entries.append(
            {"file": image_file(index), "height": int(height),
             "width": int(width)}
        )
    write_json(
        os.path.join(directory, GOLDEN_IMAGES_FILE),
        {"max_new_tokens": max_new_tokens, "images": entries,
         "outputs": records},
    )
