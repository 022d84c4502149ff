#!/usr/bin/env bash
# GPU machine: install the staged vLLM 0.26 bundle, build the trit CUDA ops and write the vLLM
# parity record of the bundled model. The same as `ci/gpu_e2e.sh setup parity` (which has the
# other stages: scale, e2e2b, tp2, scale8b, e2e8b).
# The wheels arrive in parts over several runs (a run brings at most 64 MiB): stage each part with
#     mkdir -p /tmp/vstage && cp .gpu-bundle/sN/* /tmp/vstage/
# then run this script (with the last part carried) in the final run.
#   .gpu-bundle/sN: split -b 38M -d of a tar of the wheels from ../shared/gpu/make-vllm-bundle,
#   with wheels.sha256 (see README "GPU").
exec "$(dirname "$0")/gpu_e2e.sh" setup parity
