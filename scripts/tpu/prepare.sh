#!/bin/bash
# Prepares, on this (CPU) host, everything a device call of the TPU tiers
# carries: the workplace's TPU kit copied to .tpu/, its wheels plus what
# the feature tier needs beyond them in .whl-tpu/, and the tiny models'
# fine-tunes in .tpu-art/fine_tunes (made here so the chip's minutes go to
# the checks). All three stay out of git (.git/info/exclude). Run from the
# repository root after ./scripts/bootstrap.sh:
#
#   bash scripts/tpu/prepare.sh [KIT]        # KIT: default ../shared/tpu
#
# Then, per device call (`run` with carry [".tpu", ".whl-tpu", ".tpu-art"]):
# `bash .tpu/tier.sh` (families), `CALL=a bash scripts/tpu/features.sh`,
# `bash scripts/tpu/phases.sh`. docs/TPU.md says what each call holds.
# All of it: 5 min 47 s on this 2-core host (2026-12-07, 25 fine-tunes,
# 32 MB of wheels, 23 MB of fine-tunes); re-running
# keeps what is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${1:-../shared/tpu}
if [ ! -d .tpu ]; then
  cp -r "$KIT" .tpu && chmod -R u+w .tpu
fi
for path in /.tpu/ /.whl-tpu/ /.tpu-art/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude
done
bash .tpu/fetch_wheels.sh
# vLLM dependencies the machine's own indexes lack: blake3 hashes image
# inputs; lm-format-enforcer (and interegular) is imported to validate any
# structured-output request.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --implementation cp --platform manylinux_2_17_x86_64 --platform any \
  -d .whl-tpu blake3==1.0.8 lm-format-enforcer==0.11.3 interegular==0.3.3
mkdir -p .tpu-art/fine_tunes
PYTHONPATH=tests .venv/bin/python -m helpers.tpu_tier .tpu-art/fine_tunes
rm -f .tpu-art/fine_tunes/*.lock
du -sh .tpu .whl-tpu .tpu-art
