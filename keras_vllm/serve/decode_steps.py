"""Several decode steps per engine step, on the device.

tpu-inference 0.32 can run up to `max_decode_steps` decode steps (default
10) inside one jitted loop when every request of a step decodes ("continue
decode": `runner/decode_loop.py`), so the host's work of a step
(scheduling, input preparation, dispatch, output processing) is paid once
per loop instead of once per token; vLLM's scheduler takes the extra
tokens of each request and stops it where its stop conditions say
(`core/sched/utils.py`). It is vLLM's own option:

```python
engine = keras_vllm.KerasVllmEngine.from_export(
    "exports/tuned",
    additional_config={"enable_continue_decode": True, "max_decode_steps": 8},
)
```

or `--additional-config '{"enable_continue_decode": true}'` on `vllm serve`.
On a CPU host the tiny bench model decoded 291 tok/s with it at
concurrency 1, against 300 with synchronous scheduling and 143 with vLLM's
default asynchronous one (docs/benchmarks.md, "Several decode steps per
engine step": there the device is the host, so the loop saves little; on
a TPU it is not yet measured). Greedy tokens, stop tokens, EOS,
`max_tokens` and logprobs are the same as without it.

`check()` makes it safe for keras-vllm artifacts before vLLM starts:

- asynchronous scheduling is turned off (it is on by default): with both,
  tpu-inference 0.32 feeds the loop the wrong tokens (greedy output changed
  after a few tokens on a CPU host), so `async_scheduling=True` with it is
  refused by name;
- artifacts with recurrent-state layers (`recurrent_state_layers`) are
  refused: the loop builds plain attention metadata, and their layers read
  the grouped metadata of hybrid models (it fails inside the first step);
- speculative decoding, data parallelism and LoRA adapters with it are
  refused: keras-vllm has not verified them with the loop.

`install()` fixes the scheduler of vLLM's engine process: tpu-inference
0.32 adapts vLLM's `Scheduler` to the loop (KV pages reserved for the
loop's tokens, `num_computed_tokens` advanced by them:
`core/sched/utils.py::patch_vllm_scheduler_for_continue_decode`) from
`TpuPlatform.check_and_update_config`, which runs where the config is
made: in vLLM's default multiprocess mode, the front end, not the engine
core that schedules. There the loop wrote past the pages its requests held
(greedy output changed after ~24 tokens on a CPU host); in-process engines
were right. keras-vllm's plugin runs in every vLLM process, so the
`Scheduler` built for a config with continue decode gets the adaptation
(`Scheduler.__init__`, vllm 0.32).
"""

import json

from keras_vllm import patching
from keras_vllm.errors import ServingError
from keras_vllm import format as fmt

EXAMPLE = '{"enable_continue_decode": true, "max_decode_steps": 8}'


def enabled(kwargs):
    """Whether the `vllm.LLM` keyword arguments turn continue decode on."""
    return bool(additional_config(kwargs).get("enable_continue_decode"))


def check(artifact, kwargs):
    """Refuses continue decode where it would not run or would change the
    output, and turns asynchronous scheduling off for it (in `kwargs`).

    Args:
        artifact: the opened `keras_vllm.format.Artifact`.
        kwargs: the `vllm.LLM` keyword arguments, the caller's included;
            updated in place.

    Raises:
        ServingError: naming the setting or the artifact's layers.

    Example:

    ```python
    kwargs = {"additional_config": {"enable_continue_decode": True}}
    check(artifact, kwargs)
    assert kwargs["async_scheduling"] is False
    ```
    """
    if not enabled(kwargs):
        return
    path = artifact.path
    what = f"Continue decode ({EXAMPLE} in additional_config) on '{path}'"
    if kwargs.get("async_scheduling"):
        raise ServingError(
            f"{what} cannot run with async_scheduling=True: tpu-inference "
            "0.32 then feeds its decode loop the wrong tokens. Leave "
            "async_scheduling unset (keras-vllm turns it off), or drop "
            "enable_continue_decode."
        )
    layers = artifact.read_json(fmt.CONFIG_FILE).get("recurrent_state_layers")
    if layers:
        raise ServingError(
            f"{what} cannot serve this artifact: layers {list(layers)} keep a "
            "recurrent state, and tpu-inference 0.32's decode loop builds "
            "attention metadata without their state slots. Serve it without "
            "enable_continue_decode."
        )
    for setting, value, name in (
        ("speculative_config", kwargs.get("speculative_config"),
         "speculative decoding"),
        ("data_parallel_size", int(kwargs.get("data_parallel_size") or 1) > 1,
         "data parallelism"),
        ("enable_lora", kwargs.get("enable_lora"), "LoRA adapters"),
    ):
        if value:
            raise ServingError(
                f"{what} cannot serve with {setting}: keras-vllm has not "
                f"verified {name} with tpu-inference's decode loop. Use one "
                "or the other."
            )
    kwargs["async_scheduling"] = False


def additional_config(kwargs):
    """The `additional_config` of `vllm.LLM` keyword arguments as a dict
    (JSON text read; {} when absent or not an object)."""
    config = kwargs.get("additional_config") or {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return {}
    return config if isinstance(config, dict) else {}


def install():
    """Adapts the engine process' scheduler to continue decode where its
    config asks for it (idempotent; keras-vllm's vLLM plugin calls it in
    every vLLM process)."""
    from vllm.v1.core.sched import scheduler

    patching.replace(scheduler.Scheduler, "__init__", _adapting_to_the_loop)


def _adapting_to_the_loop(original):

    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        config = getattr(vllm_config, "additional_config", None) or {}
        if not config.get("enable_continue_decode"):
            return
        from tpu_inference.core.sched import utils

        # Later schedulers and every scheduler's output updates.
        utils.patch_vllm_scheduler_for_continue_decode()
        # This one, built before: pages for the loop's extra tokens.
        steps = int(config.get("max_decode_steps",
                               utils.DEFAULT_MAX_DECODE_STEPS))
        self.num_lookahead_tokens = max(self.num_lookahead_tokens, steps - 1)

    return __init__
