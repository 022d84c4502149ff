#!/usr/bin/env bash
# GPU machine, after ci/gpu_vllm.sh installed vLLM into /tmp/site: parity at scale (issue 6).
# Generates the BitNet-2B-shaped checkpoint on the machine, dumps fp32 goldens with the reference
# on the GPU, runs the vLLM target (bf16, our CUDA ops) against them and keeps the report.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
PRESET=${PRESET:-bitnet-2b}
mkdir -p "$OUT" /tmp/models /tmp/golden
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 CUDA_HOME=/usr/local/cuda \
       TRIT_BUILD_DIR=/tmp/trit-build PYTHONUNBUFFERED=1
M=/tmp/models/$PRESET
[ -f "$M/config.json" ] || python3 -m reference.make_model --preset "$PRESET" --out "$M" --dtype bf16
python3 -m parity.dump --ref --model "$M" --out /tmp/golden/$PRESET --device cuda --force
python3 -m parity.run --target vllm --target-opt compute_dtype=bf16 --model "$M" --golden /tmp/golden/$PRESET \
  --runs "$OUT/runs" | tee "$OUT/parity-$PRESET.txt" || true
