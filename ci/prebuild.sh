#!/usr/bin/env bash
# Builds the trit extension (csrc/ -> trit_C.so + trit_C.json) for the GPU machine on a machine without a GPU, so that
# a cold GPU machine loads it (TRIT_PREBUILT=DIR) instead of spending ~200 s of device time in nvcc.
#   bash ci/prebuild.sh OUTDIR        (default OUTDIR .prebuilt, git-ignored; carry it to the device)
# What it builds against: the GPU image's torch (TORCH_VERSION, default 2.11.0 = ../shared/gpu/README.md's
# 2.11.0+cu130; PyPI's manylinux x86_64 wheel of 2.11.0 is that CUDA 13.0 build), its headers and libraries only
# (nothing is imported from it), and this machine's nvcc, which must be the GPU machine's CUDA major.minor (13.0).
# The flags are torch 2.11's cpp_extension.load ones for trit/ops.py's call (c++17, COMMON_NVCC_FLAGS, sm_90a,
# -O3 -lineinfo -DTRIT_HOST_SM90A=1; -lc10 -lc10_cuda -ltorch_cpu -ltorch_cuda -ltorch -ltorch_python -lcudart).
# The manifest is trit.ops.build_manifest's with the wheel's torch / CUDA versions and arch 9.0a: trit/ops.py loads
# the build only where that equals its own (same csrc/, torch, CUDA, TORCH_CUDA_ARCH_LIST), else it builds as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-.prebuilt}
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
ARCH=${PREBUILD_ARCH:-9.0a}
NVCC=${NVCC:-nvcc}
CXX=${CXX:-g++}
PY=${PYTHON:-.venv/bin/python}
WORK=${PREBUILD_WORK:-$(mktemp -d)}
[ "$ARCH" = "9.0a" ] || { echo "ci/prebuild.sh: only arch 9.0a (the H100 / H200) is built here, not $ARCH" >&2; exit 2; }
mkdir -p "$WORK/wheel" "$WORK/torch" "$WORK/build"
whl=$(ls "$WORK"/wheel/torch-"$TORCH_VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
    --implementation cp "torch==$TORCH_VERSION" -d "$WORK/wheel"
  whl=$(ls "$WORK"/wheel/torch-"$TORCH_VERSION"-*.whl | head -1)
fi
# headers, libraries and the version file only (~1 GB of the wheel)
"$PY" - "$whl" "$WORK/torch" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
keep = [n for n in z.namelist() if n.startswith(("torch/include/", "torch/lib/")) or n == "torch/version.py"]
z.extractall(sys.argv[2], keep)
PY
read -r TV TC < <("$PY" - "$WORK/torch/torch/version.py" <<'PY'
import sys
ns = {}
exec(open(sys.argv[1]).read(), ns)  # torch/version.py: assignments only
print(ns["__version__"], ns["cuda"])
PY
)
NV=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
[ "$NV" = "$TC" ] || { echo "ci/prebuild.sh: nvcc is CUDA $NV, torch $TV was built with CUDA $TC" >&2; exit 1; }
if [ -z "${CUDA_HOME:-}" ]; then  # the toolkit root: /usr/local/cuda, else two levels above the real nvcc
  [ -d /usr/local/cuda/include ] && CUDA_HOME=/usr/local/cuda || CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")
fi
[ -d "$CUDA_HOME/lib64" ] && CUDA_LIB=$CUDA_HOME/lib64 || CUDA_LIB=$CUDA_HOME/lib
TI=$WORK/torch/torch/include
TL=$WORK/torch/torch/lib
C=$(pwd)/csrc
common="-DTORCH_EXTENSION_NAME=trit_C -DTORCH_API_INCLUDE_EXTENSION_H -I$C -isystem $TI -isystem $TI/torch/csrc/api/include -isystem $CUDA_HOME/include"
B=$WORK/build
echo "== prebuild: torch $TV (CUDA $TC), nvcc $NV, sm_90a, in $B"
t0=$(date +%s)
$CXX -MMD -MF "$B/bindings.o.d" $common -fPIC -std=c++17 -O3 -c "$C/bindings.cpp" -o "$B/bindings.o" &
"$NVCC" $common -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
  -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
  --compiler-options '-fPIC' -O3 -lineinfo -DTRIT_HOST_SM90A=1 -std=c++17 -c "$C/ternary_gemm.cu" \
  -o "$B/ternary_gemm.cuda.o"
wait %1
$CXX "$B/bindings.o" "$B/ternary_gemm.cuda.o" -shared -L"$TL" -lc10 -lc10_cuda -ltorch_cpu -ltorch_cuda -ltorch \
  -ltorch_python -L"$CUDA_LIB" -lcudart -o "$B/trit_C.so"
echo "== built in $(( $(date +%s) - t0 )) s"
# what the loader will have to find on the GPU machine: every undefined dynamic symbol of trit_C.so that is not the C /
# C++ runtime's must be defined by the torch libraries or libcudart it links (a header / library mismatch shows here,
# not as an import error on a leased GPU)
nm -D --defined-only "$TL"/libc10.so "$TL"/libc10_cuda.so "$TL"/libtorch_cpu.so "$TL"/libtorch_cuda.so "$TL"/libtorch.so \
  "$TL"/libtorch_python.so "$CUDA_LIB"/libcudart.so "$($CXX -print-file-name=libstdc++.so.6)" 2>/dev/null \
  | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u > "$B/defined.txt"
nm -D --undefined-only "$B/trit_C.so" | awk '$1 == "U" {print $2}' | grep -vE '@(GLIBC|GLIBCXX|CXXABI|GCC)_' \
  | sed 's/@.*//' | sort -u > "$B/undefined.txt"
missing=$(comm -23 "$B/undefined.txt" "$B/defined.txt")
if [ -n "$missing" ]; then
  echo "ci/prebuild.sh: $(wc -l <<<"$missing") symbols of trit_C.so defined by none of the libraries it links:" >&2
  head -20 <<<"$missing" >&2
  exit 1
fi
echo "== $(wc -l < "$B/undefined.txt") external symbols of trit_C.so, each defined by torch $TV's libraries or libcudart"
# the manifest trit/ops.py compares (build_manifest: csrc/'s sha256, then the GPU image's versions), written with the
# .so into OUTDIR as one move each: a reader sees the old pair or the new pair's files, never a half-written one
mkdir -p "$OUTDIR"
TRIT_NO_EXT=1 "$PY" - "$B" "$TV" "$TC" "$ARCH" <<'PY'
import json, sys
from pathlib import Path
from trit.ops import build_manifest
b, tv, tc, arch = sys.argv[1:]
m = build_manifest(arch_list=arch)
m.update(torch=tv, cuda=tc)
(Path(b) / "trit_C.json").write_text(json.dumps(m, indent=1) + "\n")
PY
for f in trit_C.so trit_C.json; do
  cp "$B/$f" "$OUTDIR/.$f.tmp" && mv -f "$OUTDIR/.$f.tmp" "$OUTDIR/$f"
done
echo "== $OUTDIR: $(du -h "$OUTDIR/trit_C.so" | cut -f1) trit_C.so, manifest: $(tr -d '\n' < "$OUTDIR/trit_C.json")"
