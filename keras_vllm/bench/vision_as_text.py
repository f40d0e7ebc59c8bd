"""Engine start and output tokens/s of a Gemma 3 with a vision encoder,
served as its text decoder, next to the same decoder exported text-only.

```
python -m keras_vllm.bench.vision_as_text --prompts 16 --max-tokens 64
```

Both models are tiny random Gemma 3s of the tested shape (6 layers: five
sliding-window layers and a global one); the vision one adds a tiny
`Gemma3VisionEncoder`. The served computation is the same decoder, so the
rates should agree; the start differs by the encoder's build and load.
"""

import argparse

from keras_vllm.bench import engine_rate


def _with_vision_encoder(causal_lm):
    import keras_hub
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import (
        Gemma3VisionEncoder,
    )

    config = causal_lm.backbone.get_config()
    config["vision_encoder"] = Gemma3VisionEncoder(
        image_size=16, patch_size=4, num_heads=2, hidden_dim=16, num_layers=1,
        intermediate_dim=32, output_dim=config["hidden_dim"], pool_size=2,
        name="gemma3_vision_encoder",
    )
    config["image_size"] = 16
    return keras_hub.models.Gemma3CausalLM(
        backbone=keras_hub.models.Gemma3Backbone(**config),
        preprocessor=causal_lm.preprocessor,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    args.family = "gemma3 (6 layers)"

    from keras_vllm import testing

    text = testing.build_tiny_causal_lm("gemma3", num_layers=6)
    models = {"text-only": text, "with vision encoder": _with_vision_encoder(text)}
    prompts = engine_rate.corpus_prompts(args.prompts)
    rows = []
    for name, causal_lm in models.items():
        path = engine_rate.export(causal_lm, name.replace(" ", "_"))
        started, rate, _ = engine_rate.measure(path, prompts, args.max_tokens)
        rows.append([name, f"{started:.1f}", f"{rate:.1f}"])
    engine_rate.print_table(
        args, ["model", "engine start (s)", "output tok/s"], rows
    )


if __name__ == "__main__":
    main()
