"""The manifest sections an export computes from the live model.

Each serialized Keras object (backbone, causal LM, preprocessor, tokenizer,
sampler), the tokenizer's native assets with their fingerprint and
encode/decode probes, and the golden outputs recorded with the family's
declared reference. `exporter.py` assembles them into an artifact.
"""

import contextlib
import contextvars
import json
import os
from concurrent import futures

import numpy as np

from keras_vllm.hub import classes
from keras_vllm import format as fmt
from keras_vllm import progress
from keras_vllm.hub import reference
from keras_vllm.errors import ExportError
from keras_vllm.errors import UnsupportedModelError

TOKENIZER_PROBES = ("Hello world!", "héllo wörld 日本 🙂", "  tabs\tand\nlines ")


def versions():
    import jax
    import keras
    import keras_hub

    from keras_vllm.version import __version__

    return {
        "keras_vllm": __version__,
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
        "jax": jax.__version__,
    }


def serialize(obj, role):
    name = classes.check_exportable(obj, role)
    config = obj.get_config()
    if role == "preprocessor":
        config = {k: v for k, v in config.items() if k != "tokenizer"}
    # Round-trip through JSON so non-JSON values fail here, not at load.
    try:
        config = json.loads(json.dumps(config))
    except TypeError as e:
        raise UnsupportedModelError(
            f"The {role} config is not JSON-serializable ({e})."
        ) from None
    return {
        "class_name": type(obj).__name__,
        "registered_name": name,
        "module": type(obj).__module__,
        "config": config,
    }


def tokenizer_section(tokenizer, directory):
    assets = os.path.join(directory, fmt.TOKENIZER_ASSETS_DIR)
    os.makedirs(assets)
    tokenizer.save_assets(assets)
    section = serialize(tokenizer, "tokenizer")
    section["config"] = fmt.tokenizer_args.completed_config(
        tokenizer, section["config"]
    )
    fmt.write_json(
        os.path.join(directory, fmt.TOKENIZER_CONFIG_FILE), section
    )
    fingerprint = fmt.tokenizer_fingerprint(
        {
            name: fmt.sha256_file(os.path.join(assets, name))
            for name in os.listdir(assets)
        },
        section["config"],
    )
    probes = []
    for text in TOKENIZER_PROBES:
        ids = [int(i) for i in np.asarray(tokenizer.tokenize(text)).reshape(-1)]
        probes.append(
            {"text": text, "ids": ids, "decoded": tokenizer.detokenize(ids)}
        )
    _check_rebuilds(tokenizer, section["config"], assets, probes)
    section.update(
        {
            "fingerprint": fingerprint,
            "golden": probes,
            "assets": sorted(os.listdir(assets)),
            "start_token_id": _maybe_int(tokenizer, "start_token_id"),
            "end_token_id": _maybe_int(tokenizer, "end_token_id"),
            "pad_token_id": _maybe_int(tokenizer, "pad_token_id"),
        }
    )
    return section


def _special_token_ids(tokenizer):
    return {
        token: getattr(tokenizer, f"{attr}_id", None)
        for attr, token in fmt.tokenizer_args.special_tokens(tokenizer).items()
    }


def _check_rebuilds(tokenizer, config, assets, probes):
    """Refuses a tokenizer that its stored config and assets would not
    rebuild (the artifact could not serve it): the same special tokens
    with the same ids, the same ids for every probe."""
    cls = type(tokenizer)
    try:
        rebuilt = cls.from_config(
            fmt.tokenizer_args.constructor_config(cls.__name__, config)
        )
        rebuilt.load_assets(assets)
        problem = None
        if _special_token_ids(rebuilt) != _special_token_ids(tokenizer):
            problem = "its special tokens differ"
        for probe in probes:
            got = np.asarray(rebuilt.tokenize(probe["text"])).reshape(-1)
            if problem is None and [int(i) for i in got] != probe["ids"]:
                problem = f"it tokenizes {probe['text']!r} differently"
    except Exception as e:  # tokenizer libraries raise many types
        problem = f"{type(e).__name__}: {str(e)[:200]}"
    if problem is not None:
        raise UnsupportedModelError(
            f"The {cls.__name__} does not rebuild from its config and assets "
            f"({problem}), so the artifact would serve another tokenizer; "
            "nothing was written. It was likely built with constructor "
            "arguments its get_config() does not return, which keras-vllm "
            "stores only for "
            f"{', '.join(sorted(fmt.tokenizer_args.EXTRA_ARGUMENTS))}: "
            "please report the class, or export a model whose tokenizer "
            "comes from a KerasHub preset."
        )


def _maybe_int(obj, attr):
    value = getattr(obj, attr, None)
    return None if value is None else int(value)


def golden_reference(causal_lm, servable):
    if not servable:
        return "generate"
    from keras_vllm.layers.swap import golden_reference

    return golden_reference(causal_lm.backbone)


def prefix_caching(causal_lm, unservable):
    """The manifest's `prefix_caching`: what the paged layers declare (an
    unservable artifact is never served: True, the default)."""
    if unservable is not None:
        return True
    from keras_vllm.layers.swap import prefix_cacheable

    return prefix_cacheable(causal_lm.backbone)


def image_settings(causal_lm):
    """The manifest's `modalities.image` (None for a text-only model).

    Imported here, when an export runs: `import keras_vllm` must not
    import Keras or JAX (the layer registry does)."""
    from keras_vllm.layers import families  # noqa: F401  (registers them)
    from keras_vllm.layers.common import image_inputs

    return image_inputs.image_settings(causal_lm)


@contextlib.contextmanager
def golden_alongside(
    causal_lm, prompts, max_new_tokens, stop_token_ids, golden_ref, as_stored,
    served_length,
):
    """Records the golden outputs while the block writes the other files.

    The outputs are one compiled `generate()` call (XLA compiles it, then
    decodes on the accelerator or the host's other cores) and the block is
    mostly disk writes and hashing (orbax and hashlib release the GIL), so
    they overlap: on the 2-core host the 128M benchmark model's default
    export went from 5.35 s to 4.38 s (docs/benchmarks.md). The prompts are
    tokenized here first; the thread only generates, with no progress
    lines of its own, and the block's end waits for it under the phase
    "recording golden outputs" (also when the block fails: the thread
    uses the model until it ends).

    Args:
        causal_lm: the model being exported.
        prompts: the golden prompts (text).
        max_new_tokens: tokens generated per prompt.
        stop_token_ids: ids that end a prompt's output.
        golden_ref: the reference name (`reference.greedy_by`).
        as_stored: a context manager factory, entered in the thread around
            the generation: the model as the artifact stores it (LoRA
            factors rounded to their stored dtype).
        served_length: the artifact's `max_sequence_length`; every prompt
            and its new tokens must fit it (the loader refuses golden
            outputs that do not, or that outnumber its bounds).

    Yields:
        A `concurrent.futures.Future` of the golden section, resolved
        after the block.
    """
    prompt_ids = [reference.prompt_token_ids(causal_lm, t) for t in prompts]
    _check_golden_bounds(prompts, prompt_ids, max_new_tokens, served_length)

    def record():
        with progress.verbosity(False), as_stored():
            news = reference.greedy_batch(
                _reference_model(causal_lm, golden_ref), prompt_ids,
                max_new_tokens, stop_token_ids, golden_ref,
            )
        outputs = [
            {"prompt": text, "prompt_ids": ids, "output_ids": new}
            for text, ids, new in zip(prompts, prompt_ids, news)
        ]
        return {"max_new_tokens": max_new_tokens, "outputs": outputs}

    pool = futures.ThreadPoolExecutor(1, thread_name_prefix="keras_vllm_golden")
    future = pool.submit(contextvars.copy_context().run, record)
    try:
        yield future
    finally:
        with progress.phase(
            "recording golden outputs", total=len(prompts), unit="prompts"
        ) as phase:
            pool.shutdown(wait=True)
            phase.advance(len(prompts))


def _check_golden_bounds(prompts, prompt_ids, max_new_tokens, served):
    """Refuses golden outputs the loader would refuse
    (`keras_vllm.format.consistency`), before any is recorded."""
    problem = None
    if len(prompts) > fmt.MAX_GOLDEN_RECORDS:
        problem = f"{len(prompts)} golden prompts are more than the format's "
        problem += f"{fmt.MAX_GOLDEN_RECORDS}"
    elif len(prompts) * max_new_tokens > fmt.MAX_GOLDEN_STEPS:
        problem = (
            f"{len(prompts)} golden prompts of {max_new_tokens} new tokens "
            f"are more than the {fmt.MAX_GOLDEN_STEPS} decoding steps a "
            "reader replays"
        )
    elif not 0 <= max_new_tokens <= served:
        problem = (
            f"golden_max_new_tokens={max_new_tokens} is not between 0 and "
            f"the served sequence length {served}"
        )
    for text, ids in zip(prompts, prompt_ids):
        if problem is None and len(ids) + max_new_tokens > served:
            problem = (
                f"the golden prompt {text[:60]!r} has {len(ids)} tokens, and "
                f"with {max_new_tokens} new tokens it exceeds the served "
                f"sequence length {served}"
            )
    if problem is not None:
        raise ExportError(
            f"{problem[0].upper()}{problem[1:]}. Pass fewer or shorter "
            "`golden_prompts` or a smaller `golden_max_new_tokens`; nothing "
            "was written."
        )


def _reference_model(causal_lm, golden_ref):
    """The model whose forward pass gives the golden outputs: `causal_lm`,
    or, when it carries encoders and is served as its text decoder, that
    decoder (the forward pass is called with `token_ids` and
    `padding_mask` only, which a backbone with encoder inputs does not
    take; on text the decoder computes what the whole model computes).
    Built at recording time, so it holds the values `as_stored` set."""
    if golden_ref != "forward_pass":
        return causal_lm
    from keras_vllm.layers.swap import text_decoder_config
    from keras_vllm.load.text_decoder import text_backbone

    if text_decoder_config(causal_lm.backbone) is None:
        return causal_lm
    return type(causal_lm)(
        backbone=text_backbone(causal_lm.backbone),
        preprocessor=causal_lm.preprocessor,
    )
