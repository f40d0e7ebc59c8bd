"""What an image costs a served request on CPU: the vision encoder's share
of an image request's time, and the XLA programs images compile.

```
python -m keras_vllm.bench.image_cost --image-counts 1,2 --repeats 7
```

A tiny random Gemma 3 (the tested shape, 6 layers) with a `Gemma3VisionEncoder`
and KerasHub's image preprocessor (`--image-size` pixels in 4 x 4 patches,
pooled to 4 tokens per image; needs TensorFlow) is exported and served in
one engine, with vLLM's compile cache pointed at an empty directory so
every program is compiled here. Per image count, one prefill request (one
new token) is timed cold, then as the median of `--repeats` warm runs with
other images, next to a text-only request of the same token count; the
encoder alone is timed in the engine's worker (the runner's own encoder
entry on the state its steps run on), and the front-end's pixel conversion
(`hub.images.preprocess_images`, what the processor runs) in this process. "Programs" are the worker's XLA backend compiles
the first request of that count caused (a JAX monitoring listener), and
how many of them are encoder programs (one per image count in a step).
"""

import argparse
import os
import statistics
import time

_TOKENS_PER_IMAGE = 4


def build(image_size, layers):
    """The tiny vision Gemma 3 with an image-taking preprocessor."""
    import keras_hub
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import (
        Gemma3VisionEncoder,
    )

    from keras_vllm import testing

    text = testing.build_tiny_causal_lm("gemma3", num_layers=layers)
    config = text.backbone.get_config()
    patch = image_size // 4
    config["vision_encoder"] = Gemma3VisionEncoder(
        image_size=image_size, patch_size=patch, num_heads=2, hidden_dim=16,
        num_layers=1, intermediate_dim=32, output_dim=config["hidden_dim"],
        pool_size=2, name="gemma3_vision_encoder",
    )
    config["image_size"] = image_size
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(
        tokenizer=text.preprocessor.tokenizer,
        image_converter=keras_hub.layers.Gemma3ImageConverter(
            image_size=(image_size, image_size), scale=1 / 127.5, offset=-1.0
        ),
        num_vision_tokens_per_image=_TOKENS_PER_IMAGE,
        max_images_per_prompt=4,
        sequence_length=text.preprocessor.sequence_length,
    )
    return keras_hub.models.Gemma3CausalLM(
        backbone=keras_hub.models.Gemma3Backbone(**config),
        preprocessor=preprocessor,
    )


def _images(count, seed):
    """`count` random images, none seen before in the run (vLLM's encoder
    cache would skip an image it has encoded: each seed is used once)."""
    import numpy as np

    rng = np.random.RandomState(count * 1000 + seed)
    return [rng.randint(0, 256, (20, 24, 3)).astype("float32")
            for _ in range(count)]


def _pixels_seconds(settings, count, repeats):
    """The front-end's share: the processor's pixel conversion (the same
    `hub.images.preprocess_images` call, in this process)."""
    from keras_vllm.hub import images

    converter = images.image_converter(settings)
    times = []
    for seed in range(repeats + 1):
        pictures = _images(count, 100 + seed)
        start = time.perf_counter()
        images.preprocess_images(settings, pictures, converter)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _timed(engine, request, params):
    start = time.perf_counter()
    out = engine.generate([request], params, use_tqdm=False)[0]
    return time.perf_counter() - start, out


def measure(engine, count, repeats, settings):
    """One row: cold and warm image request, text request, encoder alone."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rpc = engine.llm.collective_rpc
    prompt = "describe " + " and ".join([settings["marker"]] * count)
    before = rpc("keras_vllm_compiles")[0]
    encoder_before = rpc("keras_vllm_image_encoder", args=([], 0))[0]
    cold, out = _timed(
        engine, {"prompt": prompt,
                 "multi_modal_data": {"image": _images(count, 0)}}, params,
    )
    compiled = rpc("keras_vllm_compiles")[0] - before
    encoder_programs = (
        rpc("keras_vllm_image_encoder", args=([], 0))[0]["programs"]
        - encoder_before["programs"]
    )
    warm = statistics.median(
        _timed(engine, {"prompt": prompt, "multi_modal_data": {
            "image": _images(count, seed)}}, params)[0]
        for seed in range(1, repeats + 1)
    )
    ids = list(out.prompt_token_ids)
    text_ids = [5 if i == settings["placeholder_token_id"] else i
                for i in ids]
    _timed(engine, {"prompt_token_ids": text_ids}, params)
    text = statistics.median(
        _timed(engine, {"prompt_token_ids": text_ids}, params)[0]
        for _ in range(repeats)
    )
    encoder = rpc("keras_vllm_image_encoder", args=([count], repeats))[0]
    return {
        "images": count, "tokens": len(ids), "cold": cold,
        "compiled": compiled,
        "encoder_programs": encoder_programs,
        "pixels": _pixels_seconds(settings, count, repeats),
        "warm": warm, "text": text,
        "encoder": encoder["seconds"][0],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-counts", default="1,2")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()

    import keras_vllm
    from keras_vllm import format as fmt
    from keras_vllm.bench import engine_rate

    os.environ["VLLM_XLA_CACHE_PATH"] = engine_rate.temporary_directory()
    path = engine_rate.export(build(args.image_size, args.layers))
    settings = fmt.image_settings(fmt.open_artifact(path).manifest)
    engine = keras_vllm.KerasVllmEngine.from_export(path, verbose=False)
    try:
        engine.llm.collective_rpc("keras_vllm_compiles")  # starts counting
        at_start = engine.llm.collective_rpc(
            "keras_vllm_image_encoder", args=([], 0)
        )[0]["programs"]
        rows = [
            measure(engine, int(count), args.repeats, settings)
            for count in args.image_counts.split(",")
        ]
    finally:
        engine.shutdown()
    print(f"\ngemma3 ({args.layers} layers), {args.image_size}x"
          f"{args.image_size} images, {_TOKENS_PER_IMAGE} tokens each, "
          f"prefill + 1 token, median of {args.repeats}; encoder programs "
          f"compiled by the engine's start-up: {at_start}")
    header = ["images", "prompt tokens", "first request (s)",
              "programs compiled (encoder)", "image request (ms)",
              "text request, same length (ms)", "pixels (ms)",
              "encoder alone (ms)", "encoder share"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print(
            f"| {r['images']} | {r['tokens']} | {r['cold']:.2f} | "
            f"{r['compiled']} ({r['encoder_programs']}) | "
            f"{1000 * r['warm']:.1f} | {1000 * r['text']:.1f} | "
            f"{1000 * r['pixels']:.1f} | {1000 * r['encoder']:.2f} | "
            f"{100 * r['encoder'] / r['warm']:.0f}% |"
        )


if __name__ == "__main__":
    main()
