"""A Gemma 3 vision model whose preprocessor takes images, served WITH
images on the real engine (format 1.10, `modalities.served` text and image):
a batch mixing image and text-only requests, one with two images, gives
`generate()`'s tokens on the same images; prompt logprobs of the text tokens
equal the Keras forward pass; `engine.chat` with an `image_url` part gives
`generate()`'s tokens on the rendered prompt; bad image requests are
refused by name (one engine for the module). Over HTTP:
`test_serving_images_http.py`."""

import numpy as np
import pytest

pytest.importorskip("tpu_inference")
pytest.importorskip("tensorflow")  # Gemma3CausalLMPreprocessor needs it.
pytestmark = pytest.mark.serving

import keras_vllm  # noqa: E402
from helpers import serving_checks  # noqa: E402
from helpers import vision_models  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm import format as fmt  # noqa: E402

NEW_TOKENS = 12
MARKER = "<start_of_image>"
# (prompt, number of images): mixed in one batch.
REQUESTS = [
    (f"the cat {MARKER} sat on", 1),
    ("the quick brown fox", 0),
    (f"{MARKER} and {MARKER} are", 2),
    ("a dog ran to the", 0),
    (f"look: {MARKER}", 1),
]


def _images(index, count):
    # KerasHub's preprocessor zero-pads a prompt's images to the largest
    # before resizing (docs/FORMAT.md, `modalities.image`): the images of
    # one prompt share a size, which each converts to alone.
    size = ((20, 24), (40, 12), (9, 30))[index % 3]
    return vision_models.images(count, seed=10 + index, sizes=(size,))


def _preprocess(causal_lm, prompt, images, length=128):
    return causal_lm.preprocessor.generate_preprocess(
        {"prompts": [prompt], "images": [images] if images else None},
        sequence_length=length,
    )


def _keras_greedy(causal_lm, prompt, images):
    return vision_models.keras_greedy(causal_lm, prompt, images, NEW_TOKENS)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = vision_models.with_image_preprocessor(trained("gemma3"))
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp("gemma3_images") / "artifact"
    )
    yield model, engine
    serving_checks.shutdown(engine)


def _requests():
    return [
        {"prompt": prompt, "multi_modal_data": {"image": _images(i, count)}}
        if count else {"prompt": prompt}
        for i, (prompt, count) in enumerate(REQUESTS)
    ]


def test_the_artifact_serves_images(served):
    _, engine = served
    artifact = fmt.open_artifact(engine.path)
    assert artifact.manifest["format_version"] == [1, 11]
    assert fmt.served_modalities(artifact.manifest) == ["text", "image"]
    config = artifact.read_json(fmt.CONFIG_FILE)
    assert config["architectures"] == [fmt.IMAGE_ARCHITECTURE]


def test_batched_image_and_text_requests_match_generate(served):
    from vllm import SamplingParams

    model, engine = served
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    outputs = engine.generate(_requests(), params)
    for i, ((prompt, count), out) in enumerate(zip(REQUESTS, outputs)):
        want_prompt, want = _keras_greedy(model, prompt, _images(i, count))
        # The same token ids as the preprocessor's (markers expanded).
        assert list(out.prompt_token_ids) == want_prompt, prompt
        assert list(out.outputs[0].token_ids) == want, prompt
    # The images matter: another image changes the continuation.
    other = engine.generate(
        [{"prompt": REQUESTS[0][0],
          "multi_modal_data": {"image": _images(99, 1)}}],
        params,
    )[0]
    _, want = _keras_greedy(model, REQUESTS[0][0], _images(99, 1))
    assert list(other.outputs[0].token_ids) == want
    assert want != list(outputs[0].outputs[0].token_ids)


def test_prompt_logprobs_of_text_tokens_match_the_forward_pass(served):
    from keras import ops
    from vllm import SamplingParams

    model, engine = served
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outputs = engine.generate(_requests(), params)
    placeholder = fmt.image_settings(engine.manifest)["placeholder_token_id"]
    worst = 0.0
    for i, ((prompt, count), out) in enumerate(zip(REQUESTS, outputs)):
        ids = list(out.prompt_token_ids)
        x = _preprocess(model, prompt, _images(i, count), length=len(ids))
        x = {k: v for k, v in x.items()}
        logits = ops.convert_to_numpy(model(x))[0].astype("float64")
        logprobs = logits - np.log(
            np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)
        ) - logits.max(-1, keepdims=True)
        for j in range(1, len(ids)):
            if ids[j] == placeholder:
                continue
            served_logprob = out.prompt_logprobs[j][ids[j]].logprob
            worst = max(worst, abs(served_logprob - logprobs[j - 1, ids[j]]))
    assert worst <= 1e-4, worst


def test_verify_engine_replays_the_golden_image_prompts(served, monkeypatch):
    from keras_vllm.format import golden_images

    _, engine = served
    artifact = fmt.open_artifact(engine.path)
    _, records = golden_images.read_golden_images(artifact.validate())
    assert [len(r["images"]) for r in records] == [1, 1, 2]
    # `keras-vllm verify --engine`: text and image prompts, served exactly.
    assert engine.check_golden() == []
    # A recorded output the engine does not give is reported, by prompt.
    read = golden_images.read_golden_images

    def altered(opened):
        steps, records = read(opened)
        ids = records[1]["output_ids"]
        records[1]["output_ids"] = ids[:-1] + [ids[-1] + 1]
        return steps, records

    monkeypatch.setattr(golden_images, "read_golden_images", altered)
    failures = engine.check_golden()
    assert [f[0] for f in failures] == [records[1]["prompt"] + " (+1 image)"]


def test_bad_image_requests_are_refused_by_name(served):
    _, engine = served
    image = _images(0, 1)
    with pytest.raises(keras_vllm.ServingError, match="2 image marker"):
        engine.generate(
            [{"prompt": f"{MARKER} {MARKER}",
              "multi_modal_data": {"image": image}}]
        )
    with pytest.raises(keras_vllm.ServingError, match="0 image marker"):
        engine.generate(
            [{"prompt": "no marker", "multi_modal_data": {"image": image}}]
        )
    # More images than the model takes (its preprocessor's limit, 2).
    with pytest.raises(Exception, match="At most 2 image"):
        engine.generate(
            [{"prompt": MARKER * 3,
              "multi_modal_data": {"image": _images(0, 3)}}]
        )
    # The engine still serves.
    assert engine.generate(["the"])[0].outputs[0].token_ids


def test_chat_with_image_parts_matches_generate(served):
    """`engine.chat` with an `image_url` part (a data: URL): Gemma 3's chat
    template writes the image marker where the part stands."""
    from vllm import SamplingParams

    from keras_vllm.layers.gemma3 import GEMMA3_CHAT_TEMPLATE

    model, engine = served
    image = _images(0, 1)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "look at"},
        {"type": "image_url",
         "image_url": {"url": vision_models.data_url(image[0])}},
        {"type": "text", "text": "now"},
    ]}]
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    out = engine.chat(messages, params, chat_template=GEMMA3_CHAT_TEMPLATE)[0]
    want_prompt, want = _keras_greedy(
        model,
        f"<start_of_turn>user\nlook at{MARKER}now<end_of_turn>\n"
        "<start_of_turn>model\n",
        image,
    )
    assert list(out.prompt_token_ids) == want_prompt
    assert list(out.outputs[0].token_ids) == want
    audio = {"type": "input_audio",
             "input_audio": {"data": "UklGRg==", "format": "wav"}}
    with pytest.raises(keras_vllm.RequestError, match="text and images only"):
        engine.chat(
            [{"role": "user", "content": [audio]}],
            chat_template=GEMMA3_CHAT_TEMPLATE,
        )
    assert engine.generate(["the"])[0].outputs[0].token_ids
