"""Golden outputs of image prompts (format 1.11): an export of a model that
serves images records Keras' greedy tokens for prompts with keras-vllm's
drawn images (`golden_images.json`, `golden_images/*.png`, checksummed like
every file); `check_golden` (`keras-vllm verify`) replays them with the
rebuilt model, and altered golden outputs or images are caught. The engine
replay (`verify --engine`) runs in tests/serve/test_serving_images.py."""

import os
import shutil

import numpy as np
import pytest

import keras_vllm
from helpers import hostile_edits as edits
from helpers import vision_models
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.format import golden_images as golden_format
from keras_vllm.format import png
from keras_vllm.hub import golden_images as drawn
from keras_vllm.load.keras_loader import check_golden

pytest.importorskip("tensorflow")  # Gemma3CausalLMPreprocessor needs it.


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    causal_lm = vision_models.with_image_preprocessor(
        testing.build_tiny_causal_lm("gemma3")
    )
    path = keras_vllm.export_vllm(
        causal_lm,
        tmp_path_factory.mktemp("gemma3_golden_images") / "artifact",
        golden_prompts=testing.prompts()[:1],
        golden_max_new_tokens=6,
        max_sequence_length=128,
    )
    return causal_lm, str(path)


@pytest.fixture(scope="module")
def reloaded(exported):
    return keras_vllm.load_causal_lm(exported[1])


def _copy(exported, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(exported[1], target)
    return str(target)


def test_the_export_records_image_prompts(exported):
    causal_lm, path = exported
    artifact = fmt.open_artifact(path).validate()
    assert artifact.manifest["format_version"] == [1, 11]
    files = artifact.manifest["files"]
    steps, records = golden_format.read_golden_images(artifact)
    assert steps == 6
    # One image, another, and two (the tiny preprocessor takes two).
    assert [r["images"] for r in records] == [[0], [1], [2, 3]]
    for index, image in enumerate(drawn.synthetic_images()):
        assert golden_format.image_file(index) in files
    placeholder = fmt.image_settings(artifact.manifest)["placeholder_token_id"]
    for record in records:
        # The markers expanded: tokens_per_image placeholders per image.
        assert record["prompt_ids"].count(placeholder) == (
            vision_models.TOKENS_PER_IMAGE * len(record["images"])
        )
        assert 0 < len(record["output_ids"]) <= 6


def test_verify_replays_the_image_prompts_with_keras(exported, reloaded):
    assert check_golden(reloaded, exported[1]) == []


def test_an_altered_golden_output_is_reported(exported, reloaded, tmp_path):
    path = _copy(exported, tmp_path)

    def bump(golden):
        ids = golden["outputs"][2]["output_ids"]
        ids[-1] = (ids[-1] + 1) % 100

    edits.edit_json(path, fmt.GOLDEN_IMAGES_FILE, bump)
    failures = check_golden(reloaded, path)
    assert [f[0] for f in failures] == ["<start_of_image> and "
                                        "<start_of_image> are (+2 images)"]


def test_an_altered_image_is_caught_by_its_checksum(exported, tmp_path):
    path = _copy(exported, tmp_path)
    image = os.path.join(path, golden_format.image_file(1))
    with open(image, "rb") as f:
        height, width, rgb = png.decode(f.read(), 256)
    with open(image, "wb") as f:
        f.write(png.encode(height, width, bytes([255 - rgb[0]]) + rgb[1:]))
    with pytest.raises(keras_vllm.IntegrityError, match="golden_images/1.png"):
        fmt.open_artifact(path)
    # Read alone (the artifact opened without hashing), still refused.
    artifact = fmt.open_artifact(path, verify=False)
    with pytest.raises(keras_vllm.IntegrityError, match="golden image"):
        golden_format.read_golden_images(artifact.validate())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda m: m.update(format_version=[1, 10]), "format 1.11 file"),
        (lambda m: m["files"].pop(fmt.GOLDEN_IMAGES_FILE) and None,
         "listed but no golden_images.json"),
    ],
)
def test_golden_images_in_a_wrong_artifact_are_refused(
    exported, tmp_path, mutate, message
):
    path = _copy(exported, tmp_path)
    edits.edit(path, mutate)
    if fmt.GOLDEN_IMAGES_FILE not in edits.read_manifest(path)["files"]:
        os.remove(os.path.join(path, fmt.GOLDEN_IMAGES_FILE))
    else:
        edits.rehash_files(path)
    with pytest.raises(keras_vllm.ArtifactError, match=message):
        fmt.open_artifact(path).validate()


def test_malformed_records_are_refused(exported, tmp_path):
    path = _copy(exported, tmp_path)

    def one_image_too_few(golden):
        golden["outputs"][2]["images"] = [2]

    edits.edit_json(path, fmt.GOLDEN_IMAGES_FILE, one_image_too_few)
    with pytest.raises(keras_vllm.ArtifactError, match="markers and images"):
        fmt.open_artifact(path).validate()


def test_png_reads_only_what_it_writes():
    pixels = np.arange(5 * 7 * 3, dtype="uint8").reshape(5, 7, 3)
    data = png.encode(5, 7, pixels.tobytes())
    height, width, rgb = png.decode(data, 16)
    np.testing.assert_array_equal(
        drawn.as_array((height, width, rgb)), pixels
    )
    # What any PNG reader sees (Pillow, a dependency of vLLM, when here).
    image = pytest.importorskip("PIL.Image")
    import io

    np.testing.assert_array_equal(
        np.asarray(image.open(io.BytesIO(data))), pixels
    )
    with pytest.raises(keras_vllm.ArtifactError, match="over 4 a side"):
        png.decode(data, 4)
    with pytest.raises(keras_vllm.ArtifactError, match="bad checksum"):
        png.decode(data[:40] + bytes([data[40] ^ 1]) + data[41:], 16)
    with pytest.raises(keras_vllm.ArtifactError, match="no PNG signature"):
        png.decode(b"GIF89a" + data[6:], 16)
