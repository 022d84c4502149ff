#!/usr/bin/env bash
# GPU machine: install the staged vLLM 0.26 bundle, build the trit CUDA ops, run the vLLM
# parity record (bench/vllm_parity.py).  The wheels arrive in parts over several runs
# (a run brings at most 64 MiB): stage each part with
#     mkdir -p /tmp/vstage && cp .gpu-bundle/bN/* /tmp/vstage/
# then run this script (with the last part carried) in the final run.
#   .gpu-bundle/bN: split -b 44M of a tar of the wheels from ../shared/gpu/make-vllm-bundle,
#   with wheels.sha256 (see README "GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ ! -d /tmp/site/vllm ]; then
  ( cd /tmp/vstage && cat wheels.tar.part* > wheels.tar && sha256sum -c wheels.sha256 && mkdir -p w && tar -xf wheels.tar -C w \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site w/*.whl )
fi
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 CUDA_HOME=/usr/local/cuda \
       TRIT_BUILD_DIR=/tmp/trit-build PYTHONUNBUFFERED=1
export TRIT_COMMIT=${TRIT_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
python3 -c "import trit.ops as o; print('trit ext:', getattr(o, 'EXTENSION_ERROR', None) or 'loaded')"
python3 -m bench.vllm_parity --out "$OUT" "$@" 2>&1 | tee "$OUT/vllm_parity.log" | grep -vE "^\(EngineCore|^INFO|DEBUG" || true
ls -la "$OUT"
