#!/usr/bin/env bash
# Run by hand on a machine with a GPU (the device tool's lent machine: Python with CUDA torch, transformers,
# tokenizers and safetensors; no Beam, no vLLM, no network). A few minutes. Writes the figures to $OUT (or /tmp).
# vLLM is NOT run here: it is not installed on such a machine and cannot be fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
"$PYTHON" -c "import torch, transformers, tokenizers, safetensors" \
  || { echo "needs torch, transformers, tokenizers and safetensors"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" benchmarks/gpu_check.py --device "${DEVICE:-cuda}" ${QUICK:+--quick} --json "${OUT:-/tmp}/gpu_check.json"
