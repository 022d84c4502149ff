#!/usr/bin/env bash
# Builds the trit extension (csrc/ -> trit_C.so + trit_C.json) for the GPU machine on a machine without a GPU, so that
# a cold GPU machine loads it (TRIT_PREBUILT=DIR) instead of spending ~200 s of device time in nvcc.
#   bash ci/prebuild.sh [OUTDIR]      (default: the repo's .prebuilt, git-ignored; carry it to the device)
# What it builds against: the GPU image's torch (TORCH_VERSION, default 2.11.0 = ../shared/gpu/README.md's
# 2.11.0+cu130; PyPI's manylinux x86_64 wheel of 2.11.0 is that CUDA 13.0 build), its headers and libraries only
# (nothing is imported from it; they are the same in every CPython version's wheel), and nvcc, which must be the
# CUDA major.minor that torch was built with (13.0).
# The flags are torch 2.11's cpp_extension.load ones for trit/ops.py's call (c++17, COMMON_NVCC_FLAGS, sm_90a,
# -O3 -lineinfo -DTRIT_HOST_SM90A=1; -lc10 -lc10_cuda -ltorch_cpu -ltorch_cuda -ltorch -ltorch_python -lcudart).
# The sources are a copy of csrc/ taken first, and the manifest (trit.ops.build_manifest's, with the wheel's torch /
# CUDA versions and arch 9.0a) hashes that copy: an edit during the build cannot label the library. trit/ops.py loads
# the build only where the manifest equals its own (same csrc/, torch, CUDA, TORCH_CUDA_ARCH_LIST), else it builds.
# Checked before it is written: every external symbol is defined by the libraries it links, and the glibc /
# libstdc++ versions it needs are within the GPU image's (Ubuntu 24.04: GLIBC 2.39, GLIBCXX 3.4.32 of GCC 13; the
# image's own builds say "GCC: (Ubuntu 13.3.0-6ubuntu2~24.04)"; PREBUILD_MAX_GLIBC / PREBUILD_MAX_GLIBCXX).
# The wheel is kept in PREBUILD_CACHE (default ~/.cache/trit/prebuild); the scratch directory is removed at exit.
set -euo pipefail
OUTDIR=$(realpath -m "${1:-$(dirname "$0")/../.prebuilt}")
cd "$(dirname "$0")/.."
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
NVCC=${NVCC:-nvcc}
CXX=${CXX:-g++}
PY=${PYTHON:-.venv/bin/python}
MAX_GLIBC=${PREBUILD_MAX_GLIBC:-2.39}
MAX_GLIBCXX=${PREBUILD_MAX_GLIBCXX:-3.4.32}
CACHE=${PREBUILD_CACHE:-$HOME/.cache/trit/prebuild}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE" "$WORK/torch" "$WORK/build"
cp -r csrc "$WORK/csrc"  # the sources built and hashed
whl=$(ls "$CACHE"/torch-"$TORCH_VERSION"-*manylinux*x86_64.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
    --implementation cp "torch==$TORCH_VERSION" -d "$WORK/wheel"
  mv "$WORK"/wheel/torch-"$TORCH_VERSION"-*.whl "$CACHE/"
  whl=$(ls "$CACHE"/torch-"$TORCH_VERSION"-*manylinux*x86_64.whl | head -1)
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
# the toolkit of $NVCC (its real path two levels up; /usr/local/cuda where nvcc is a wrapper outside the toolkit)
if [ -z "${CUDA_HOME:-}" ]; then
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")
  [ -f "$CUDA_HOME/include/cuda_runtime.h" ] || CUDA_HOME=/usr/local/cuda
fi
release() { "$1" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p'; }
NV=$(release "$NVCC")
[ "$NV" = "$TC" ] || { echo "ci/prebuild.sh: nvcc is CUDA $NV, torch $TV was built with CUDA $TC" >&2; exit 1; }
[ ! -x "$CUDA_HOME/bin/nvcc" ] || [ "$(release "$CUDA_HOME/bin/nvcc")" = "$NV" ] \
  || { echo "ci/prebuild.sh: CUDA_HOME=$CUDA_HOME is CUDA $(release "$CUDA_HOME/bin/nvcc"), $NVCC is $NV" >&2; exit 1; }
[ -d "$CUDA_HOME/lib64" ] && CUDA_LIB=$CUDA_HOME/lib64 || CUDA_LIB=$CUDA_HOME/lib
CUDART=$(ls "$CUDA_LIB"/libcudart.so* 2>/dev/null | head -1 || true)
[ -n "$CUDART" ] || { echo "ci/prebuild.sh: no libcudart.so in $CUDA_LIB (CUDA_HOME=$CUDA_HOME)" >&2; exit 1; }
TI=$WORK/torch/torch/include
TL=$WORK/torch/torch/lib
C=$WORK/csrc
common="-DTORCH_EXTENSION_NAME=trit_C -DTORCH_API_INCLUDE_EXTENSION_H -I$C -isystem $TI -isystem $TI/torch/csrc/api/include -isystem $CUDA_HOME/include"
B=$WORK/build
echo "== prebuild: torch $TV (CUDA $TC), nvcc $NV ($CUDA_HOME), sm_90a"
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
libs=("$TL"/libc10.so "$TL"/libc10_cuda.so "$TL"/libtorch_cpu.so "$TL"/libtorch_cuda.so "$TL"/libtorch.so
      "$TL"/libtorch_python.so "$CUDART" "$($CXX -print-file-name=libstdc++.so.6)")
for f in "${libs[@]}"; do [ -f "$f" ] || { echo "ci/prebuild.sh: $f does not exist" >&2; exit 1; }; done
nm -D --defined-only "${libs[@]}" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u > "$B/defined.txt"
nm -D --undefined-only "$B/trit_C.so" | awk '$1 == "U" {print $2}' | grep -vE '@(GLIBC|GLIBCXX|CXXABI|GCC)_' \
  | sed 's/@.*//' | sort -u > "$B/undefined.txt"
missing=$(comm -23 "$B/undefined.txt" "$B/defined.txt")
if [ -n "$missing" ]; then
  echo "ci/prebuild.sh: $(wc -l <<<"$missing") symbols of trit_C.so defined by none of the libraries it links:" >&2
  head -20 <<<"$missing" >&2
  exit 1
fi
# the C / C++ runtime versions it needs (this machine's compiler may be newer than the image's)
need() { objdump -T "$B/trit_C.so" | grep -oE "\b$1_[0-9.]+" | sed "s/^$1_//" | sort -V | tail -1; }
for v in "GLIBC $MAX_GLIBC" "GLIBCXX $MAX_GLIBCXX"; do
  set -- $v
  have=$(need "$1")
  if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$have" "$2" | sort -V | tail -1)" != "$2" ]; then
    echo "ci/prebuild.sh: trit_C.so needs $1_$have, newer than the GPU image's $1_$2 (PREBUILD_MAX_$1)" >&2
    exit 1
  fi
done
echo "== $(wc -l < "$B/undefined.txt") external symbols, each defined by torch $TV's libraries, libcudart or libstdc++;" \
     "needs GLIBC_$(need GLIBC), GLIBCXX_$(need GLIBCXX) (image: $MAX_GLIBC, $MAX_GLIBCXX)"
TRIT_NO_EXT=1 "$PY" - "$B" "$C" "$TV" "$TC" <<'PY'
import json, sys
from pathlib import Path
from trit.ops import build_manifest
b, csrc, tv, tc = sys.argv[1:]
m = build_manifest(Path(csrc), arch_list="9.0a")
m.update(torch=tv, cuda=tc)
(Path(b) / "trit_C.json").write_text(json.dumps(m, indent=1) + "\n")
PY
# into OUTDIR: the old manifest goes first and the new one comes last, each file by one rename, so that no reader
# ever pairs a manifest with a library it does not describe
mkdir -p "$OUTDIR"
cp "$B/trit_C.so" "$OUTDIR/.trit_C.so.tmp"
cp "$B/trit_C.json" "$OUTDIR/.trit_C.json.tmp"
rm -f "$OUTDIR/trit_C.json"
mv -f "$OUTDIR/.trit_C.so.tmp" "$OUTDIR/trit_C.so"
mv -f "$OUTDIR/.trit_C.json.tmp" "$OUTDIR/trit_C.json"
echo "== $OUTDIR: $(du -h "$OUTDIR/trit_C.so" | cut -f1) trit_C.so, manifest: $(tr -d '\n' < "$OUTDIR/trit_C.json")"
