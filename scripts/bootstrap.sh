#!/usr/bin/env bash
# Creates ./.venv (Python 3.12) with keras-vllm and its serving and test
# extras installed. Safe to re-run: an existing .venv is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${PYTHON:-}" python3.12 \
      "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
        >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  echo "keras-vllm: Python 3.12 not found (vllm-tpu 0.32 needs it)." \
       "Install it, or set PYTHON=/path/to/python3.12." >&2
  return 1
}

# One line per step (the install takes minutes); pip itself stays quiet.
step() { echo "keras-vllm: $*"; }

if [ ! -x .venv/bin/python ]; then
  python="$(find_python)"
  step "creating .venv with $python"
  "$python" -m venv .venv
else
  step "reusing $(pwd)/.venv"
fi
step "upgrading pip"
.venv/bin/python -m pip install --quiet --upgrade pip
step "installing keras-vllm[serving,test] (vllm-tpu, JAX, keras-hub, ...;" \
     "a few minutes the first time)"
.venv/bin/python -m pip install --quiet -e ".[serving,test]"
echo "keras-vllm: installed in $(pwd)/.venv"
