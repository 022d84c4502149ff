#!/usr/bin/env bash
# The test command (README): every unit test, the parity suite on the bundled model
# (bf16 target against golden/tiny-bitnet), and the vLLM-CPU parity suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export TORCH_COMPILE_DISABLE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest tests parity -q -p no:cacheprovider "$@"
