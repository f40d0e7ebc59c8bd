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

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[serving,test]"
echo "keras-vllm: installed in $(pwd)/.venv"
