#!/bin/bash
# One device call of the feature tier (#59; docs/TPU.md, "Features on the
# chip"): the CPU tier's feature modules run on the chip against Keras on
# the same chip, engines in the test process, both sides at "highest"
# precision. CALL picks the call (each ~8 minutes of tests, measured at
# 365214c):
#   a  images (Gemma 3, Gemma 4, Gemma 4 E2B): TensorFlow for the Keras
#      reference, installed from the machine's own index (~40 s)
#   b  live updates, warm starts, structured output, adapter artifacts,
#      Gemma 3n's adapters
#   c  Qwen 3.5 in int8, `keras-vllm demo`, a plain vllm.LLM on the demo's
#      artifact in a process that holds the chip
# (MTP, Llama 3 / MoE adapters and int4 / GPTQ / int8 experts passed at
# 365214c: FULL=1 adds them to their call, a: none, b: MTP, c: the rest.
# At c29c41b b and c passed but for the shutdown checks, moved to their own
# module since; a ran out of time in Gemma 4, its references compiled since.)
# Run from the repository root after scripts/tpu/prepare.sh, carrying
# .tpu, .whl-tpu and .tpu-art; logs come back in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; START=$SECONDS; DEADLINE=${DEADLINE:-570}
. .tpu/env.sh
export VLLM_ENABLE_V1_MULTIPROCESSING=0 JAX_DEFAULT_MATMUL_PRECISION=highest \
  SKIP_JAX_PRECOMPILE=1 KERAS_VLLM_TPU_FINE_TUNES=$PWD/.tpu-art/fine_tunes
rm -f .tpu-art/fine_tunes/*.lock
K="not over_http and not two_processes"
# ONLY narrows the selections built on K (a -k expression, e.g. ONLY=gemma4
# for the image checks Gemma 3 passed at c29c41b).
[ -n "${ONLY:-}" ] && K="$K and ($ONLY)"
left() { echo $((DEADLINE - (SECONDS - START))); }
tests() {  # tests NAME PYTEST_ARGS...: one pytest process, log $OUT/NAME.log
  local name=$1; shift
  timeout "$(left)" python3 -m pytest -v -p no:cacheprovider -rA \
    -o console_output_style=times "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? at $((SECONDS - START)) s: $(tail -1 "$OUT/$name.log")"
}
case ${CALL:-} in
a)
  TF=/tmp/tf
  pipi() {
    python3 -m pip install --isolated -q --no-compile --only-binary=:all: \
      --index-url file:///opt/pypi/simple --target $TF "$@" >> "$OUT/tf.log" 2>&1
  }
  if [ ! -d $TF/tensorflow ]; then
    # With its dependencies where the index has them all (1.4 GB, ~40 s
    # at 365214c), else without, adding those the stack lacks one by one.
    pipi "tensorflow-cpu==2.21.*" || {
      pipi --no-deps "tensorflow-cpu==2.21.*"
      for dep in wrapt gast opt_einsum termcolor astunparse google_pasta; do
        pipi --no-deps "$dep" || true
      done
    }
    pipi --no-deps "tensorflow-text==2.21.*" || true
    echo "tensorflow: at $((SECONDS - START)) s: $(ls -d $TF/tensorflow* 2>/dev/null | xargs -n1 basename | tr '\n' ' ')"
  fi
  # After the stack: where both ship a package (numpy, keras, ...), the
  # stack's copy is the one imported.
  export PYTHONPATH=$PYTHONPATH:$TF
  tests images -k "$K" tests/serve/test_serving_images.py
  ;;
b)
  extra=(); [ -n "${FULL:-}" ] && extra=(tests/serve/test_mtp_speculation.py)
  tests updates -k "$K" tests/serve/test_weight_updates.py \
    tests/serve/test_engine_shutdown.py tests/serve/test_compile_cache.py \
    tests/serve/test_structured_outputs.py tests/serve/test_lora_adapters.py \
    "${extra[@]}"
  tests gemma3n_adapters -k "gemma3n" tests/serve/test_multi_adapter.py
  ;;
c)
  if [ -n "${FULL:-}" ]; then
    tests quantized -k "$K" tests/serve/test_quantized_serving.py \
      tests/serve/test_multi_adapter.py tests/serve/test_moe_lora_serving.py
  else
    tests qwen3_5_int8 -k "qwen3_5" tests/serve/test_quantized_serving.py
  fi
  timeout "$(left)" python3 -m keras_vllm.cli demo --steps 30 \
    --workdir /tmp/demo > "$OUT/demo.log" 2>&1
  echo "demo: rc=$? at $((SECONDS - START)) s: $(tail -1 "$OUT/demo.log")"
  timeout "$(left)" python3 scripts/tpu/plain_llm.py /tmp/demo/artifact \
    > "$OUT/plain_llm.log" 2>&1
  echo "plain_llm: rc=$? at $((SECONDS - START)) s: $(tail -1 "$OUT/plain_llm.log")"
  ;;
*)
  echo "CALL=a, b or c (see the header)"; exit 2
  ;;
esac
