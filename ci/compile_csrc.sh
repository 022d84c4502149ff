#!/usr/bin/env bash
# Compile gate for csrc/ on a machine without a GPU (runs in CI on every commit).
#   1. nvcc compiles csrc/ternary_gemm.cu alone for sm_90a (plain CUDA, no torch headers),
#      failing on any ptxas spill (a spilled kernel is a performance bug) or serialised wgmma.
#   2. the host compiler compiles csrc/bindings.cpp against the installed torch's headers
#      (device-agnostic headers only, so a CPU-only torch wheel suffices).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
CXX=${CXX:-g++}
PY=${PYTHON:-python3}
BUILD=${BUILD:-$(mktemp -d)}
ARCH=${ARCH:--gencode=arch=compute_90a,code=sm_90a}

echo "== nvcc $($NVCC --version | tail -1)"
mkdir -p "$BUILD/keep"
$NVCC -std=c++17 -O3 $ARCH -DTRIT_HOST_SM90A=1 -lineinfo -Xptxas -v -Icsrc -c csrc/ternary_gemm.cu -o "$BUILD/ternary_gemm.o" \
  --keep --keep-dir "$BUILD/keep" 2> "$BUILD/ptxas.txt" || { cat "$BUILD/ptxas.txt"; exit 1; }
if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$BUILD/ptxas.txt"; then
  echo "ptxas reports register spills (above)"; exit 1
fi
# wgmma serialised by ptxas (C7513: each wgmma waited for alone), or a warpgroup.arrive injected per
# wgmma (C7519: input registers written after the fence), is a performance bug like a spill
if grep -E "C7513|C7519|wgmma.mma_async instructions are serialized" "$BUILD/ptxas.txt"; then
  echo "ptxas serialises wgmma or injects arrives (above)"; exit 1
fi
# the default chain kernels (template flag TMA = false) must hold no mbarrier: its presence alone makes ptxas put
# a MEMBAR.ALL.CTA before every __threadfence of the grid barrier (csrc/ternary_gemm.cu chain_kernel; H200 run 32b)
ptx=$(ls "$BUILD"/keep/*.ptx | head -1)
[ -n "$ptx" ] || { echo "no PTX kept in $BUILD/keep"; exit 1; }
n_chain=$(grep -cE '^\.(visible )?\.?entry .*chain_kernelI.*Lb[01]ELb0EEEv' "$ptx" || true)
awk '/\.entry /{e = ($0 ~ /chain_kernelI.*Lb[01]ELb0EEEv/) ? $0 : ""} e != "" && /mbarrier/{print "mbarrier in " e; bad = 1}
     END{exit bad}' "$ptx" || { echo "a default (TMA = false) chain kernel holds an mbarrier (above)"; exit 1; }
[ "$n_chain" -ge 12 ] || { echo "expected >= 12 default chain kernel entries in the PTX, found $n_chain"; exit 1; }
echo "kernels: $(grep -c 'Compiling entry' "$BUILD/ptxas.txt") entry points, no spills, wgmma batched, $n_chain default chain kernels without mbarrier"

# the read-bandwidth probe of bench/read_floor.py (its own shared library, built by nvcc on the GPU machine)
$NVCC -std=c++17 -O3 $ARCH -Xptxas -v -c csrc/read_probe.cu -o "$BUILD/read_probe.o" 2> "$BUILD/ptxas-probe.txt" \
  || { cat "$BUILD/ptxas-probe.txt"; exit 1; }
if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$BUILD/ptxas-probe.txt"; then echo "read_probe spills (above)"; exit 1; fi

TORCH_INC=$($PY -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
echo "== $CXX against $TORCH_INC"
$CXX -std=${CXX_STD:-c++20} -O2 -fPIC -Wall -Wno-unused-parameter -isystem "$TORCH_INC" -isystem "$TORCH_INC/torch/csrc/api/include" \
  -Icsrc -c csrc/bindings.cpp -o "$BUILD/bindings.o"
echo "compile_csrc: OK ($BUILD)"
