#!/usr/bin/env bash
# Builds .gpu/part4: TRL's stack for the GPU host (trl, accelerate, datasets and their small deps, 2.9 MB),
# which the GPU image lacks (it has transformers, pandas and pyarrow). Send it with part1 (55 MB + 2.9 MB
# + the project without its examples stays under a call's 64 MiB); on the host, `bash .gpu/part4/install.sh`
# installs each wheel into /tmp/site only where the image lacks its distribution, and prints the versions
# it ends with. Checked on an H100 on 2026-12-07: TRL 1.16.0 GRPOTrainer colocated with vLLM 0.26.0
# (scripts/trl_grpo.py --device cuda).
#
#   usage (from the project root): bash scripts/gpu_trl_bundle.sh [.gpu/part4]
set -euo pipefail
dest=${1:-.gpu/part4}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$dest/whl"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$dest/whl" trl==1.16.0 accelerate==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  xxhash==4.1.0 fsspec==2026.9.0
cp "$(dirname "$0")/gpu_trl_install.sh" "$dest/install.sh"
du -sh "$dest"
