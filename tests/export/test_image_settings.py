"""Format 1.9 `modalities.image`, served since 1.10: an export of a Gemma 3
vision model with an image-taking preprocessor stores how that preprocessor
turns an image prompt into pixels and token ids, and `keras_vllm.hub.images`
redoes it from the artifact alone, equal to KerasHub's `generate_preprocess`;
the artifact's tokenizer expands image markers the same way, and every entry
point serves it with unchunked image inputs (no engine here: the engine
module is tests/serve/test_serving_images.py)."""

import copy

import numpy as np
import pytest

import keras_vllm
from keras_vllm import format as fmt
from keras_vllm import testing
from keras_vllm.hub import images as image_io
from helpers import vision_models
from keras_vllm.serve import preflight
from keras_vllm.serve.frontend import modality_checks
from keras_vllm.serve.frontend import refusals

pytest.importorskip("tensorflow")  # Gemma3CausalLMPreprocessor needs it.

PROMPTS = [
    "the cat <start_of_image> sat",
    "<start_of_image> and <start_of_image>?",
    "<start_of_image><start_of_image>",
    "no image at all",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    causal_lm = vision_models.with_image_preprocessor(
        testing.build_tiny_causal_lm("gemma3")
    )
    path = keras_vllm.export_vllm(
        causal_lm,
        tmp_path_factory.mktemp("gemma3_images") / "artifact",
        golden_prompts=(),
    )
    return causal_lm, fmt.open_artifact(path).manifest, str(path)


def test_the_artifact_stores_the_image_settings(exported):
    causal_lm, manifest, _ = exported
    assert manifest["format_version"] == list(fmt.FORMAT_VERSION)
    settings = fmt.image_settings(manifest)
    tokenizer = causal_lm.preprocessor.tokenizer
    assert settings == {
        "converter": {
            "image_size": [16, 16],
            "scale": pytest.approx(1 / 127.5),
            "offset": -1.0,
            "interpolation": "bilinear",
            "antialias": False,
            "crop_to_aspect_ratio": True,
            "pad_to_aspect_ratio": False,
        },
        "encoder_image_size": 16,
        "tokens_per_image": vision_models.TOKENS_PER_IMAGE,
        "max_images_per_prompt": 2,
        "marker": "<start_of_image>",
        "expansion": {
            "before": "\n\n<start_of_image>",
            "placeholder": "<img>",
            "after": "<end_of_image>\n\n",
        },
        "placeholder_token_id": tokenizer.image_placeholder_id,
        "attention": "bidirectional_within_image",
    }
    # Format 1.10: the artifact serves images, under its own architecture.
    assert fmt.served_modalities(manifest) == ["text", "image"]


def test_prompt_expansion_gives_the_preprocessors_token_ids(exported):
    causal_lm, manifest, _ = exported
    settings = fmt.image_settings(manifest)
    preprocessor = causal_lm.preprocessor
    tokenizer = preprocessor.tokenizer
    for prompt in PROMPTS:
        count = image_io.count_markers(settings, prompt)
        x = preprocessor.generate_preprocess(
            {"prompts": [prompt],
             "images": [vision_models.images(count)] if count else None},
            sequence_length=48,
        )
        want = np.asarray(x["token_ids"])[0][np.asarray(x["padding_mask"])[0]]
        got = [tokenizer.start_token_id] + [
            int(i) for i in np.asarray(
                tokenizer.tokenize(image_io.expand_prompt(settings, prompt))
            ).reshape(-1)
        ]
        assert got == want.tolist(), prompt
        placeholders = np.asarray(got) == settings["placeholder_token_id"]
        assert placeholders.sum() == count * settings["tokens_per_image"]
        np.testing.assert_array_equal(
            placeholders, np.asarray(x["vision_mask"])[0][: len(got)]
        )


def test_pixels_equal_the_preprocessors(exported):
    causal_lm, manifest, _ = exported
    settings = fmt.image_settings(manifest)
    converter = image_io.image_converter(settings)
    # KerasHub pads a batch's images to the largest before resizing: one
    # image per call (or images of one size) is what it converts alone.
    for image in vision_models.images(4, seed=3):
        x = causal_lm.preprocessor.generate_preprocess(
            {"prompts": ["a <start_of_image>"], "images": [[image]]},
            sequence_length=32,
        )
        want = np.asarray(x["images"])[0, :1]
        got = image_io.preprocess_images(settings, [image], converter)
        assert got.shape == (1, 16, 16, 3)
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_pil_image_converts_as_its_array(exported):
    from PIL import Image

    _, manifest, _ = exported
    settings = fmt.image_settings(manifest)
    array = vision_models.images(1, seed=5)[0]
    pil = Image.fromarray(array.astype("uint8"))
    np.testing.assert_allclose(
        image_io.preprocess_images(settings, [pil]),
        image_io.preprocess_images(settings, [array]),
    )
    with pytest.raises(keras_vllm.ServingError, match="RGB"):
        image_io.preprocess_images(settings, [np.zeros((4, 4), "float32")])


def test_a_text_only_model_stores_no_image_settings(exported, tmp_path):
    text_lm = testing.build_tiny_causal_lm("gemma3")
    path = keras_vllm.export_vllm(
        text_lm, tmp_path / "text", golden_prompts=()
    )
    assert fmt.image_settings(fmt.open_artifact(path).manifest) is None
    # A vision model whose preprocessor takes no image stores none either.
    no_converter = vision_models.with_vision_encoder(text_lm)
    path = keras_vllm.export_vllm(
        no_converter, tmp_path / "no_converter", golden_prompts=()
    )
    assert fmt.image_settings(fmt.open_artifact(path).manifest) is None


def test_the_reader_checks_the_image_settings(exported):
    _, manifest, _ = exported
    fmt.validate_manifest(copy.deepcopy(manifest))
    older = copy.deepcopy(manifest)
    older["format_version"] = [1, 9]
    with pytest.raises(keras_vllm.ArtifactError, match="format 1.10 value"):
        fmt.validate_manifest(older)
    older["modalities"]["served"] = ["text"]
    fmt.validate_manifest(copy.deepcopy(older))  # a 1.9 vision export
    older["format_version"] = [1, 8]
    with pytest.raises(keras_vllm.ArtifactError, match="format 1.9 field"):
        fmt.validate_manifest(older)
    no_settings = copy.deepcopy(manifest)
    del no_settings["modalities"]["image"]
    with pytest.raises(keras_vllm.ArtifactError, match="modalities.image"):
        fmt.validate_manifest(no_settings)
    edits = {
        "tokens_per_image": 0,
        "attention": "sideways",
        "marker": "",
        "placeholder_token_id": -1,
    }
    for key, value in edits.items():
        bad = copy.deepcopy(manifest)
        bad["modalities"]["image"][key] = value
        with pytest.raises(keras_vllm.ArtifactError, match=key):
            fmt.validate_manifest(bad)
    bad = copy.deepcopy(manifest)
    bad["modalities"]["image"]["converter"]["image_size"] = [16]
    with pytest.raises(keras_vllm.ArtifactError, match="image_size"):
        fmt.validate_manifest(bad)
    bad = copy.deepcopy(manifest)
    bad["modalities"]["image"]["converter"]["scale"] = "big"
    with pytest.raises(keras_vllm.ArtifactError, match="scale"):
        fmt.validate_manifest(bad)


# Serving it, without an engine (the engine module: tests/serve/
# test_serving_images.py).


def test_the_tokenizer_expands_markers_as_the_preprocessor(exported):
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    causal_lm, _, path = exported
    tokenizer = KerasVllmTokenizer.from_pretrained(path)
    for prompt in PROMPTS:
        count = prompt.count("<start_of_image>")
        x = causal_lm.preprocessor.generate_preprocess(
            {"prompts": [prompt],
             "images": [vision_models.images(count)] if count else None},
            sequence_length=48,
        )
        want = np.asarray(x["token_ids"])[0][np.asarray(x["padding_mask"])[0]]
        assert tokenizer.encode(prompt) == want.tolist(), prompt


def test_every_entry_point_serves_images_unchunked(exported):
    from keras_vllm.cli.serve import serve_command

    _, _, path = exported
    kwargs = preflight.serving_defaults(fmt.open_artifact(path), {})
    assert kwargs["disable_chunked_mm_input"] is True
    assert kwargs["enable_prefix_caching"] is False
    command = serve_command(path, [])
    assert "--disable-chunked-mm-input" in command
    assert "--no-enable-prefix-caching" in command
    message = refusals.refusal(path, ["vllm", "serve", path])
    assert "serves images" in message and "--disable-chunked-mm-input" in message
    assert refusals.refusal(
        path, ["vllm", "serve", path, "--disable-chunked-mm-input",
               "--no-enable-prefix-caching"]
    ) is None


def test_markers_and_images_must_agree(exported):
    _, _, path = exported
    manifest = fmt.open_artifact(path).manifest
    image = vision_models.images(1)[0]
    ok = [{"prompt": "a <start_of_image>", "multi_modal_data": {"image": image}},
          {"prompt": "text only"}]
    modality_checks.check_request("generate", ok, manifest)
    with pytest.raises(keras_vllm.ServingError, match="audio"):
        modality_checks.check_request(
            "generate", [{"prompt": "a", "multi_modal_data": {"audio": 1}}],
            manifest,
        )
    with pytest.raises(keras_vllm.ServingError, match="1 image marker"):
        modality_checks.check_request(
            "generate",
            [{"prompt": "<start_of_image>",
              "multi_modal_data": {"image": [image, image]}}],
            manifest,
        )
