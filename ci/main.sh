#!/usr/bin/env bash
# The main job on the bundled default model: regenerate goldens from the fp32 reference into a
# scratch set (the committed golden/ stays untouched), check they equal the committed ones (bit
# for bit where both were computed on the same kind of host, else within the fp32-a8 tiers),
# then run the parity suite's bf16 target against them and print the per-layer table.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash ci/setup.sh
. .venv/bin/activate
export TORCH_COMPILE_DISABLE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
MODEL=${MODEL:-models/tiny-bitnet}
SCRATCH=parity_runs/golden/$(basename "$MODEL")
python -m parity.dump --ref --model "$MODEL" --out "$SCRATCH" --force
python -m parity.golden_diff "$SCRATCH" "golden/$(basename "$MODEL")"
python -m parity.run --target "${TARGET:-bf16}" --model "$MODEL" --golden "$SCRATCH"
