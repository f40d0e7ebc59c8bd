#!/bin/bash
# One device call for #60: where a decode step's time goes on the chip.
# `keras_vllm.bench.step_phases` on the medium model (128M float32 Qwen2)
# at concurrency 1, 8, 32: keras-vllm (C) and vLLM serving tpu-inference's
# own Qwen2 on the HF checkpoint of the same weights (B), then both with
# tpu-inference's continue decode (8 decode steps in one jitted loop).
# Tables in $OUT/phases.log. Run from the
# repository root after scripts/tpu/prepare.sh, carrying .tpu and .whl-tpu.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; START=$SECONDS; DEADLINE=${DEADLINE:-570}
. .tpu/env.sh
export SKIP_JAX_PRECOMPILE=${SKIP_JAX_PRECOMPILE:-1}
left() { echo $((DEADLINE - (SECONDS - START))); }
# One process: the medium model is built and exported once for the four
# engines (~100 s on the chip), each engine ~60-100 s.
timeout "$(left)" python3 -m keras_vllm.bench.step_phases --model medium \
  --systems C,B --concurrencies 1,8,32 --engine-args '{}' --engine-args \
  '{"additional_config": {"enable_continue_decode": true, "max_decode_steps": 8}}' \
  > "$OUT/phases.log" 2>&1
echo "phases: rc=$? at $((SECONDS - START)) s"
grep -E "^\||^[CB]: " "$OUT/phases.log"
