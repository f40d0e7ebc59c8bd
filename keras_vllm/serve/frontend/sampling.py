"""Sampling parameters vLLM's TPU backend does not apply, refused.

tpu-inference (pinned 0.32.0, `keras_vllm.patching.PINNED_VERSIONS`)
samples with temperature, top-k and top-p only (its
`TPUSupportedSamplingMetadata`), on a TPU and on keras-vllm's CPU backend
alike. Of the other `vllm.SamplingParams` fields that change which tokens
are drawn:

- `presence_penalty`, `frequency_penalty`, `repetition_penalty` and `min_p`
  are never read, and `logit_bias` and `bad_words` are recorded but never
  applied, so a request that sets them gets other text than it asked for
  (vLLM's GPU backend applies them all), without a word;
- `allowed_token_ids` stops the engine (a `TypeError` in tpu-inference's
  `InputBatch.add_request` kills the engine core, and with it every
  request in flight and the server);
- a per-request `seed` of a sampled request is refused by tpu-inference
  (its platform's `validate_request`), where `vllm serve` turns the error
  into a 500 with an empty message;
- structured outputs on a data-parallel engine stop it: tpu-inference's
  `DPScheduler` pickles each new request to its replica's scheduler
  process, and a request's grammar holds a lock (`TypeError: cannot pickle
  '_thread.RLock' object` kills the engine core);
- structured outputs on an engine that speculates (`speculative_config`)
  get masks on the wrong rows: tpu-inference's
  `StructuredDecodingManager` writes one grammar row per request, indexed
  by request, where a verify step has one logits row per drafted token.

So a request to an engine serving a keras-vllm artifact that sets one of
them is refused before it reaches the engine, with a
`VLLMValidationError` that names the parameter
(`vllm serve` answers 400 and keeps serving; `KerasVllmEngine.generate`
raises it). `KERAS_VLLM_UNAPPLIED_SAMPLING=ignore` serves the first group
anyway, unapplied, with a warning per parameter; `allowed_token_ids` and
`seed` are always refused. Requests to other models are left as vLLM
handles them.

Patched: `InputProcessor._validate_params` (vLLM 0.32.0), where vLLM
checks a request's parameters against the served model's config.
"""

import logging

from keras_vllm import envs
from keras_vllm import patching

logger = logging.getLogger("keras_vllm")

# (field, the value that means "not used") of the parameters the backend
# reads nowhere or records without applying.
UNAPPLIED = (
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("repetition_penalty", 1.0),
    ("min_p", 0.0),
    ("logit_bias", None),
    ("bad_words", None),
)
# Parameters that stop the engine: refused whatever the variable says.
FATAL = ("allowed_token_ids",)

_warned = set()


def _is_set(value, neutral):
    if neutral is None:
        return bool(value)
    return value is not None and value != neutral


def check(params, greedy=None, replicas=1, speculative=False):
    """Raises for a field of `params` the TPU backend would not apply.

    Args:
        params: a `vllm.SamplingParams`.
        greedy: whether the request is greedy; read from `params` when
            None. `min_p` never changes a greedy pick, so it passes then.
        replicas: the engine's data-parallel replicas.
        speculative: whether the engine drafts tokens (`speculative_config`).

    Raises:
        vllm.exceptions.VLLMValidationError: names the first such field.
    """
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingType

    if greedy is None:
        greedy = params.sampling_type == SamplingType.GREEDY
    for name in FATAL:
        value = getattr(params, name, None)
        if value:
            raise VLLMValidationError(
                f"{name} is not supported by vLLM's TPU backend "
                "(tpu-inference), which serves this keras-vllm model: such a "
                "request would stop the engine. Leave it unset.",
                parameter=name,
            )
    if replicas > 1 and getattr(params, "structured_outputs", None) is not None:
        raise VLLMValidationError(
            "structured_outputs is not supported on a data-parallel engine "
            f"({replicas} replicas) by vLLM's TPU backend (tpu-inference "
            "0.32's data-parallel scheduler cannot hand the request's grammar "
            "to a replica, and the engine would stop). Serve structured "
            "outputs from an engine with data_parallel_size=1.",
            parameter="structured_outputs",
        )
    if speculative and getattr(params, "structured_outputs", None) is not None:
        raise VLLMValidationError(
            "structured_outputs is not supported on an engine that "
            "speculates (speculative_config) by vLLM's TPU backend "
            "(tpu-inference 0.32 applies one grammar mask per request, where "
            "a step that verifies drafted tokens needs one per token: the "
            "masks would land on the wrong rows). Serve structured outputs "
            "from an engine without speculative_config.",
            parameter="structured_outputs",
        )
    if params.seed is not None and not greedy:
        # tpu-inference refuses it too, but later, where `vllm serve`
        # answers 500 with an empty message.
        raise VLLMValidationError(
            f"seed={params.seed!r} is not supported by vLLM's TPU backend "
            "(tpu-inference), which serves this keras-vllm model: it draws "
            "every request from the engine's own seed (the engine's `seed`). "
            "Leave it unset.",
            parameter="seed",
            value=params.seed,
        )
    ignore = envs.UNAPPLIED_SAMPLING.get() == "ignore"
    for name, neutral in UNAPPLIED:
        value = getattr(params, name, None)
        if not _is_set(value, neutral) or (name == "min_p" and greedy):
            continue
        if ignore:
            if name not in _warned:
                _warned.add(name)
                logger.warning(
                    "keras-vllm: %s is not applied by vLLM's TPU backend; "
                    "requests that set it are sampled without it (%s=ignore).",
                    name, envs.UNAPPLIED_SAMPLING.name,
                )
            continue
        raise VLLMValidationError(
            f"{name}={value!r} is not applied by vLLM's TPU backend "
            "(tpu-inference samples with temperature, top_k and top_p only), "
            "which serves this keras-vllm model: the request would be "
            f"sampled as if {name} were unset. Leave it unset, or set "
            f"{envs.UNAPPLIED_SAMPLING.name}=ignore to serve such requests "
            "without it.",
            parameter=name,
            value=value,
        )


def install():
    """Makes vLLM's request checks in this process refuse what the
    backend would not apply, for keras-vllm models (keras-vllm's vLLM
    plugin calls this in every vLLM process)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    from keras_vllm.serve.hf_config import serves_artifact

    def refusing(original):
        def _validate_params(self, params, *args, **kwargs):
            result = original(self, params, *args, **kwargs)
            if isinstance(params, SamplingParams) and serves_artifact(
                self.model_config
            ):
                config = getattr(self, "vllm_config", None)
                check(
                    params,
                    replicas=_replicas(config),
                    speculative=getattr(config, "speculative_config", None)
                    is not None,
                )
            return result

        return _validate_params

    patching.replace(InputProcessor, "_validate_params", refusing)


def _replicas(vllm_config):
    """The data-parallel replicas of an engine (tpu-inference keeps them in
    its sharding config and resets vLLM's `data_parallel_size` to 1)."""
    sharding = getattr(vllm_config, "sharding_config", None)
    return int(getattr(sharding, "total_dp_size", 1) or 1)
