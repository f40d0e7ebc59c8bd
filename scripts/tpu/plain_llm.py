"""A plain `vllm.LLM` on a keras-vllm artifact, in a process that holds the
chip, as a serving team would start one without keras-vllm's engine class.

    python3 scripts/tpu/plain_llm.py ARTIFACT

Opens the TPU first (as a training script that exported in the same process
would), then serves the artifact's golden prompts greedily through
`vllm.LLM` and compares each with the output recorded at export. vLLM runs
its engine in this process (a TPU opens in one process at a time), which
keras-vllm's plugin asks of it. Prints one line per prompt; exit code 0 when
every output equals the recorded one.
"""

import json
import os
import sys
import time


def main(artifact):
    import jax

    print(f"devices: {jax.devices()}", flush=True)
    import vllm

    with open(os.path.join(artifact, "golden.json")) as f:
        golden = json.load(f)
    with open(os.path.join(artifact, "manifest.json")) as f:
        stops = json.load(f)["stop_token_ids"]
    start = time.time()
    llm = vllm.LLM(model=artifact, max_model_len=256)
    print(f"engine ready in {time.time() - start:.0f} s "
          f"(VLLM_ENABLE_V1_MULTIPROCESSING="
          f"{os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING')})", flush=True)
    records = golden["outputs"]
    params = vllm.SamplingParams(
        temperature=0.0, max_tokens=golden["max_new_tokens"],
        stop_token_ids=stops, skip_special_tokens=False,
    )
    outputs = llm.generate(
        [{"prompt_token_ids": r["prompt_ids"]} for r in records], params,
        use_tqdm=False,
    )
    equal = 0
    for record, output in zip(records, outputs):
        served = list(output.outputs[0].token_ids)
        equal += served == record["output_ids"]
        mark = "==" if served == record["output_ids"] else "!="
        print(f"{record['prompt']!r:>24} {mark} recorded", flush=True)
    print(f"{equal}/{len(records)} equal the recorded outputs", flush=True)
    # An engine process of its own (vLLM's default where this process holds
    # no chip, as on a CPU host) would outlive `os._exit`; an in-process
    # one may not let the interpreter exit (the kit's notes).
    llm.llm_engine.engine_core.shutdown()
    os._exit(0 if equal == len(records) else 1)


if __name__ == "__main__":
    main(sys.argv[1])
