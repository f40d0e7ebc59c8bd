"""Gemma 3 with images at tensor parallelism 2, on two virtual CPU devices
(one engine): the vision encoder runs on its weights as the generic
placement rules leave them (replicated but its projection into the decoder,
XLA partitioning the jitted encoder), image spans attend through the sharded pure-JAX kernel
(`jax_kernel_attention.sharded_kernel_attention`), and a batch mixing image
and text-only requests, one with two images, gives `generate()`'s tokens on
the same images; the artifact's golden text and image prompts replay."""

import pytest

pytest.importorskip("tpu_inference")
pytest.importorskip("tensorflow")  # Gemma3CausalLMPreprocessor needs it.
pytestmark = pytest.mark.serving

from helpers import serving_checks  # noqa: E402
from helpers import vision_models  # noqa: E402
from helpers.trained_models import trained  # noqa: E402
from keras_vllm.hub import golden_images  # noqa: E402
from keras_vllm.hub import reference  # noqa: E402

NEW_TOKENS = 10
MARKER = "<start_of_image>"
# (prompt, image sizes): one batch; a prompt's images share a size
# (KerasHub pads them to the largest, keras-vllm converts each alone).
REQUESTS = [
    (f"the cat {MARKER} sat on", [(20, 24)]),
    ("the quick brown fox", []),
    (f"{MARKER} and {MARKER} are", [(40, 12), (40, 12)]),
    (f"look: {MARKER}", [(9, 30)]),
]


def _images(index, sizes):
    return vision_models.images(len(sizes), seed=30 + index, sizes=sizes)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = vision_models.with_image_preprocessor(trained("gemma3"))
    engine = serving_checks.start_engine(
        model, tmp_path_factory.mktemp("gemma3_images_tp2") / "artifact",
        tensor_parallel_size=2,
    )
    yield model, engine
    serving_checks.shutdown(engine)


def test_images_at_tp2_match_generate(served):
    from vllm import SamplingParams

    model, engine = served
    requests = [
        {"prompt": prompt, "multi_modal_data": {"image": _images(i, sizes)}}
        if sizes else {"prompt": prompt}
        for i, (prompt, sizes) in enumerate(REQUESTS)
    ]
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    outputs = engine.generate(requests, params)
    image_cases = [
        (prompt, _images(i, sizes))
        for i, (prompt, sizes) in enumerate(REQUESTS) if sizes
    ]
    expected = iter(golden_images.greedy_with_images(
        model, image_cases, NEW_TOKENS, None, 256
    ))
    for (prompt, sizes), out in zip(REQUESTS, outputs):
        if not sizes:
            ids = list(out.prompt_token_ids)
            want = serving_checks.expected_batch(
                reference.greedy_continuation, model, [ids],
                NEW_TOKENS,
            )[0]
            assert list(out.outputs[0].token_ids) == want, prompt
            continue
        want_prompt, want = next(expected)
        assert list(out.prompt_token_ids) == want_prompt, prompt
        assert list(out.outputs[0].token_ids) == want, prompt


def test_golden_text_and_image_prompts_replay_at_tp2(served):
    _, engine = served
    assert engine.check_golden() == []


def test_the_encoder_is_replicated_and_its_projection_split(served):
    """The generic placement rules (`serve/worker/sharding.py`) key on the
    decoder's hidden size: the encoder's own layers are narrower, so they
    stay whole on every device (see `image_model._encoder`), and only the
    projection into the decoder's width is split, over its input rows."""
    _, engine = served
    layout = engine.weights_layout()
    assert len(layout["devices"]) == 2
    variables = layout["variables"]
    encoder = {p: v for p, v in variables.items()
               if p.startswith("image_encoder/")}
    assert len(encoder) > 10
    assert not any(any(v["spec"]) for v in encoder.values())
    projection = variables["vision_output_encoder/vision_input_projection/kernel"]
    assert projection["spec"][0] is not None
    # The decoder is split as in text-only serving.
    assert any(variables["decoder_block_0/attention/query/kernel"]["spec"])
