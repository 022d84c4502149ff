#!/usr/bin/env bash
# The GPU job for the trit kernels (run it on a CUDA machine, e.g. the H200 device):
#   build the extension -> GPU + CPU tests -> compute-sanitizer memcheck/racecheck on a few
#   representative shapes -> python -m bench.kernels.
# Everything is written under $OUT (default /tmp/trit-out): junit.xml, sanitizer.txt,
# sass.txt, gemm-probe.json and the bench JSON/Markdown (its log: redirect stdout there, `bash ci/gpu_kernels.sh > $OUT/log.txt 2>&1`). STAGES=build,probe,test,sanitize,bench selects stages (also readfloor: bench/read_floor.py after the bench; chain: bench.chain of this tree, CHAIN_ARGS / CHAIN_REPS; sanchain: the chain kernel under three sanitizer tools;
# ab: bench.chain of older trees beside this one, AB_TAR=".ab/A.tar.gz .ab/B.tar.gz", each from `git archive REV
# csrc trit bench reference ci pyproject.toml`: a bisect in one call; the old trees build while the build stage
# builds this one, and $OUT/ab.txt gets every row plus bench/ab_summary.py's table)
# (plus ncu: the small-M kernels at M = 1, ncugemm: the a8 GEMM kernel's loops at M = 64 / 128,
# ncuquant: the a8 quantizer at M = 1 for K = 2560 - 28672, ncuactq: TRIT_ACT_QUANT's kAct quantizer vs the plain one, ncunorm: rms_norm_a8q at M = 1, ncupro:
# ternary_mm_a8_prologue vs the fused-quantizer GEMV at M = 1, ncuchain: the chain kernel per source line against
# the ab stage's trees);
# (actq: bench.act_quant, ACTQ_ARGS; normq: bench.x_footprint --no-scale --norm, NORMQ_CASES; normc:
# bench.norm_quant, NORMC_ARGS: rms_norm_a8q's cluster variants against Inductor's norm + the a8 quantizer;
# a8split: bench.a8_breakdown, A8SPLIT_ARGS: the a8 op's quantizer / GEMM kernel / rest at 16 < M <= 256;
# export: the build and its manifest to $OUT/prebuilt, for TRIT_PREBUILT=DIR on a later cold machine);
# BENCH_ARGS passes arguments to the bench; TEST_K selects tests (-k), TEST_SHARD=i/n one of n slices of them (below). Wheels in .whl/ (pytest, hypothesis, humming...)
# are installed to /tmp/site first when present (the GPU machine has no network). To make them,
# on a networked machine: pip download --no-deps --only-binary=:all: --python-version 3.12
#   --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl
#   pytest pluggy iniconfig pygments packaging hypothesis sortedcontainers attrs
#   humming-kernels==0.1.10 pyelftools        (.whl/ is git-ignored; the device run carries it)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/trit-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRIT_BUILD_DIR=${TRIT_BUILD_DIR:-/tmp/trit-build}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# Hopper: build for sm_90a even where the image presets a plain 9.0 (the wgmma loops need it)
[ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" = "9.0" ] && export TORCH_CUDA_ARCH_LIST=9.0a
STAGES=${STAGES:-build,probe,test,sanitize,bench}
BENCH_ARGS=${BENCH_ARGS:-}
PY=${PYTHON:-python3}
rc=0
has() { [[ ",$STAGES," == *",$1,"* ]]; }
step() { echo; echo "=== $* ($(date -u +%T))"; }
# ncu_run NAME DRIVER [ncu options]: profile the driver script under ncu (clocks as the GPU sets them) into
# $OUT/NAME, within NCU_TIMEOUT seconds (default 150); a failure is reported, not fatal. NCU_ENV: KEY=VALUE words
# set for the profiled process only (e.g. NCU_ENV="TRIT_A8_XI=0": a variant's kernels)
ncu_run() {
  local name=$1 driver=$2; shift 2
  env ${NCU_ENV:-} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout ${NCU_TIMEOUT:-150} ncu --clock-control none "$@" \
    $PY "$driver" > "$OUT/$name" 2>&1 || echo "ncu failed (see $name)"
}

# chain_round RAW SUMMARY LABEL TIMEOUT TAG ARGS...: one `bench.chain ARGS` (run in "${run[@]}", empty: this tree)
# within TIMEOUT s, its output in RAW.txt and its record under RAW; a failure ("LABEL failed (rc N): ...") and the
# table rows (each prefixed with TAG) appended to SUMMARY
chain_round() {
  local raw=$1 sum=$2 label=$3 t=$4 tag=$5; shift 5
  "${run[@]}" timeout "$t" $PY -m bench.chain "$@" --out "$raw" > "$raw.txt" 2>&1 \
    || { echo "$label failed (rc $?): $(tail -n 2 "$raw.txt" | tr '\n' ' ')" | tee -a "$sum"; rc=1; }
  grep -hE "^\| *(tail|2b|8b)" "$raw.txt" | sed "s/^/$tag/" | tee -a "$sum"
}

# the ab stage's scratch (raw bench outputs; $OUT gets one summary file, ab.txt: the device returns <= 8 files)
AB_DIR=${AB_DIR:-/tmp/ab-out}
# in_old NAME CMD...: CMD in the extracted old tree NAME, with its own build directory
in_old() { local n=$1; shift; ( cd /tmp/ab-tree-$n && TRIT_BUILD_DIR=/tmp/trit-build-ab-$n PYTHONPATH=/tmp/ab-tree-$n${PYTHONPATH:+:$PYTHONPATH} "$@" ); }

if compgen -G ".whl/*.whl" >/dev/null; then
  step "install carried wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv || true

if has ab; then
  # same-run A/B of bench.chain against older trees, run at its step below; its trees are extracted and built
  # here, in the background, while the build stage builds this tree (run 34: building them one after the
  # other cost a whole device call)
  ab_names=""; ab_pids=""; ab_ok=1
  tars=$(echo "${AB_TAR:-}" | tr ',' ' ')
  missing=""
  for t in $tars; do [ -f "$t" ] || missing="$missing $t"; done
  if [ -z "$tars" ] || [ -n "$missing" ]; then echo "AB_TAR not set or missing:${missing:- (empty)}"; rc=1; ab_ok=0; else
    rm -rf "$AB_DIR"; mkdir -p "$AB_DIR"
    for t in $tars; do
      n=$(basename "$t" .tar.gz)
      case " $ab_names " in *" $n "*) echo "AB_TAR names $n twice"; rc=1; continue ;; esac
      ab_names="$ab_names $n"
      rm -rf /tmp/ab-tree-$n; mkdir -p /tmp/ab-tree-$n && tar -xzf "$t" -C /tmp/ab-tree-$n
    done
    for n in $ab_names; do
      in_old $n $PY -c "import trit.ops as o; assert o.EXTENSION_LOADED, o.EXTENSION_ERROR; print('$n: extension loaded')" \
        > "$AB_DIR/build-$n.txt" 2>&1 & ab_pids="$ab_pids $!"
    done
  fi
fi

if has build; then
  step "build extension"
  t0=$(date +%s)
  TRIT_VERBOSE=${TRIT_VERBOSE:-} $PY -c "import sys, trit.ops as o; assert o.EXTENSION_LOADED, o.EXTENSION_ERROR; open(sys.argv[1], 'w').write(o.EXTENSION_SO)" /tmp/trit-so.txt || exit 1
  so=$(cat /tmp/trit-so.txt)
  echo "extension loaded from $so; build+load: $(( $(date +%s) - t0 )) s"
  if has export && [ -n "$so" ]; then
    # the build and its manifest, for TRIT_PREBUILT on the next (cold) machine: copy $OUT/prebuilt to an ignored
    # folder of the repo, carry it and set TRIT_PREBUILT to it (trit/ops.py loads it only while csrc/ is unchanged)
    mkdir -p "$OUT/prebuilt" && cp "$so" "$OUT/prebuilt/trit_C.so" && cp "$(dirname "$so")/trit_C.json" "$OUT/prebuilt/" \
      && echo "exported $(du -h "$OUT/prebuilt/trit_C.so" | cut -f1) build to \$OUT/prebuilt"
  fi
  if [ -n "$so" ] && command -v cuobjdump >/dev/null; then
    cuobjdump --dump-sass "$so" > /tmp/trit-sass.txt 2>&1
    { echo "SASS instruction counts per kernel (HMMA/IMMA = tensor cores, LDG.E.128 = 16-byte loads)";
      awk '/Function :/{f=$3} /HMMA|IMMA|LDG.E.128|LDL|STL/{for(i=1;i<=NF;i++) if($i ~ /^(HMMA|IMMA|LDG|LDL|STL)/){split($i,a,"."); c[f" "a[1]]++}} END{for(k in c) print c[k], k}' /tmp/trit-sass.txt | sort -k2 | c++filt; } > "$OUT/sass.txt"
  fi
fi

if has probe; then
  # a new GEMM main loop against the default on structured inputs (bench/gemm_probe.py): which input,
  # channel and row each result came from; its own process, so a kernel fault cannot end the job
  step "gemm probe (TRIT_A8_GEMM_WG=1)"
  timeout 120 $PY -m bench.gemm_probe --out "$OUT" > "$OUT/gemm-probe.log" 2>&1 || { echo "gemm probe: differs or failed"; rc=1; }
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print('M', r['M'], 'equal', r['equal'], 'inputs', r['input_map']['n_wrong'], 'channels', r['channel_map']['n_wrong'], 'rows', r['row_map']['n_wrong']) for r in d['results']]" "$OUT/gemm-probe.json" 2>/dev/null || tail -5 "$OUT/gemm-probe.log"
fi

if has test; then
  step "tests"
  test_files=(tests/test_ops.py tests/test_ops_cuda.py tests/test_bitplane.py)
  # TEST_SHARD=i/n: the i-th of n contiguous slices of the collected tests (after TEST_K), so that the whole GPU
  # suite (~10 min on an H100 in run 85, past one device call's 600 s) runs over n calls; junit-i-of-n.xml
  if [ -n "${TEST_SHARD:-}" ]; then
    if [[ ! "$TEST_SHARD" =~ ^([0-9]+)/([0-9]+)$ ]] || (( BASH_REMATCH[1] < 1 || BASH_REMATCH[1] > BASH_REMATCH[2] )); then
      echo "TEST_SHARD=$TEST_SHARD: expected i/n with 1 <= i <= n"; rc=1
    else
      si=${BASH_REMATCH[1]} sn=${BASH_REMATCH[2]}
      $PY -m pytest -q -p no:cacheprovider --collect-only "${test_files[@]}" ${TEST_K:+-k "$TEST_K"} \
        | grep '::' > /tmp/trit-test-ids || true
      total=$(wc -l < /tmp/trit-test-ids)
      lo=$(( total * (si - 1) / sn )) hi=$(( total * si / sn ))
      mapfile -t shard_ids < <(sed -n "$((lo + 1)),${hi}p" /tmp/trit-test-ids)
      echo "shard $si/$sn: tests $((lo + 1))-$hi of $total"
      if (( total == 0 )); then echo "no tests collected"; rc=1
      elif (( ${#shard_ids[@]} > 0 )); then
        timeout ${TEST_TIMEOUT:-540} $PY -m pytest -q -p no:cacheprovider "${shard_ids[@]}" --durations=15 \
          --junitxml="$OUT/junit-$si-of-$sn.xml" --maxfail=25 || rc=1
      fi
    fi
  else
    timeout ${TEST_TIMEOUT:-400} $PY -m pytest -q -p no:cacheprovider "${test_files[@]}" ${TEST_K:+-k "$TEST_K"} --junitxml="$OUT/junit.xml" --maxfail=25 || rc=1
  fi
fi

if has sanitize; then
  step "compute-sanitizer"
  cat > /tmp/trit_sanitize_driver.py <<'PYEOF'
# Tiny driver: every kernel on a few representative shapes (tile edges, K tails, split-K), with the
# default knobs (per-shape auto choices) and with each variant forced on or off.
import os
import torch
from trit import ops
SETS = ({}, {"TRIT_A8_FUSEQ": "1", "TRIT_WN": "2", "TRIT_A8_DENSE_MIN_M": "17"},
              {"TRIT_A8_FUSEQ": "0", "TRIT_WN": "1", "TRIT_A8_GEMM": "1"},
              {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_CFG": "1"}, {"TRIT_A8_GEMM_CFG": "2"}, {"TRIT_A8_GEMM_CFG": "3"},
              {"TRIT_A8_GEMM_CFG": "4"},
              {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_KS": "3"}, {"TRIT_A8_GEMM_CFG": "0"},
              # the default mma.sync tiles (on sm_90a the auto route runs wgmma unless WG=0)
              {"TRIT_A8_GEMM_WG": "0"},
              {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_KS": "3", "TRIT_A8_GEMM_EARLY": "0"},
              {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_KS": "3", "TRIT_A8_GEMM_EARLY": "1", "TRIT_A8_GEMM_WG": "1"},
              {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_KS": "0"}, {"TRIT_A8_GEMM_WG": "2"},
              {"TRIT_A8_GEMM_WG_OVERLAP": "1", "TRIT_A8_GEMM_KS": "3"}, {"TRIT_A8_GEMM_WG": "1", "TRIT_A8_GEMM_KS": "0"},
              {"TRIT_A8_GEMM_WG_OVERLAP": "0"}, {"TRIT_A8_GEMM_WG_OVERLAP": "1", "TRIT_A8_GEMM_WG_DEEP": "1"},
              {"TRIT_A8_GEMM_WG": "1", "TRIT_A8_GEMM_KS": "3"}, {"TRIT_A8_GEMM_WG_DEEP": "0", "TRIT_A8_GEMM_WG": ""},
              {"TRIT_A8_GEMM": "0", "TRIT_A8_GEMM_WG": "0", "TRIT_A8_GEMM_EARLY": "1"},
              # the cluster quantizer at M <= 8 (last: the knobs accumulate): up to 8 CTAs per row, then 1
              {"TRIT_A8_FUSEQ": "0", "TRIT_QUANT_CLUSTER": "8"}, {"TRIT_QUANT_CLUSTER": "1"},
              # the L2 head prefetch (TRIT_L2PF=3): 3 k-blocks per warp, fewer than some warps own
              {"TRIT_L2PF": "3", "TRIT_L2PF_HEAD": "3"},
              # the fused quantizer with 3 tiles per CTA (the last CTA's warps clamp), head prefetch still on
              {"TRIT_A8_FUSEQ": "1", "TRIT_NW": "3"},
              # 8 < M <= 32 on the plain k-block-major xq (the default interleaves it: TRIT_A8_XI)
              {"TRIT_A8_XI": "0", "TRIT_A8_FUSEQ": "", "TRIT_NW": ""},
              # the interleaved xq's quantizer as the cluster kernel (zero-row clusters; S = 3 at M = 20, K = 9000)
              {"TRIT_A8_XI": "1", "TRIT_QUANT_CLUSTER_XI": "1", "TRIT_QUANT_CLUSTER": "8"},
              # rms_norm_a8q's cluster kernel: the row over up to 8 CTAs of a cluster (S = 2..8 at the K >= 4096
              # shapes below, odd K tails), then the one-CTA-per-row cluster form (S = 1)
              {"TRIT_RNQ_CLUSTER": "8"}, {"TRIT_RNQ_CLUSTER": "1"},
              # the GEMM kernel's quantizer as the cluster kernel (kKbm; one CTA per row, then up to 8), the GEMM
              # route forced at M <= 64 (split-K counters zeroed by the quantizer)
              {"TRIT_RNQ_CLUSTER": "", "TRIT_A8_GEMM_QCL": "1"}, {"TRIT_A8_GEMM_QCL": "8", "TRIT_A8_GEMM": "1"},
              # the MT = 8 GEMV over two row tiles at 64 < M <= 128 (M = 70 below: 6 zero rows in the second tile)
              {"TRIT_A8_GEMM_QCL": "", "TRIT_A8_GEMM": "", "TRIT_A8_MT8_ROWS2": "1"})
# SAN_LAST=n: the default set and the last n sets only (a quick check of the newest knobs)
if int(os.environ.get("SAN_LAST", "0")) > 0:
  SETS = SETS[:1] + SETS[-int(os.environ["SAN_LAST"]):]
for knobs in SETS:
  os.environ.update(knobs)
  for (M, N, K) in [(1, 33, 300), (1, 33, 304), (1, 2560, 6912), (5, 100, 1000), (8, 48, 8200), (17, 129, 1001), (24, 100, 2600), (40, 64, 1000), (70, 256, 4099), (3, 6160, 1000), (12, 6160, 520), (300, 6144, 520), (1, 64, 16384), (2, 40, 16383), (3, 24, 10241), (20, 64, 9000)]:  # v5 MT=1 (tail k-block), MT=2/4/8, a8 M>64: int8 cuBLAS, M=300: the 128-row wgmma loop (csrc/a8_route.h)
      for dt in (torch.bfloat16, torch.float32):
          x = torch.randn(M, K, device="cuda").to(dt)
          w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
          p, s, b = ops.repack(w), torch.rand(N, device="cuda"), torch.randn(N, device="cuda").to(dt)
          for op in (torch.ops.trit.ternary_mm, torch.ops.trit.ternary_mm_a8, torch.ops.trit.ternary_mm_naive):
              op(x, p, s, N, K, b)
          torch.ops.trit.ternary_mm_a8q(x, *ops.a8_quantize(x), p, s, N, K, b)  # M <= 8: the GEMV on given xq
          if M <= 32:  # the bitplane layout's GEMV (ternary_mm_a8_bp runs at M <= 32 only)
              torch.ops.trit.ternary_mm_a8_bp(x, ops.repack_bitplane(p), s, N, K, b)
          # the RMSNorm + quantizer kernel (with and without the residual add) feeding that GEMV
          h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, x, torch.rand(K, device="cuda").to(dt), 1e-6)
          torch.ops.trit.rms_norm_a8q(x, None, torch.rand(K, device="cuda").to(dt), 1e-6)
          torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, N, K, b)
          # the same with the tiled xq (layout 1: the interleaved GEMV at 8 < M <= 32, zero rows / tail written)
          h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, x, torch.rand(K, device="cuda").to(dt), 1e-6, 1)
          torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, N, K, b, 1)
          # the norm / activation prologue inside the GEMV (one kernel at M = 1, K % 8 == 0; composed elsewhere)
          nw = torch.rand(K, device="cuda").to(dt)
          torch.ops.trit.ternary_mm_a8_prologue(x, x, nw, 1e-6, 0, p, s, N, K, b)
          torch.ops.trit.ternary_mm_a8_prologue(torch.cat([x, x], 1), None, nw, 1e-6, 1, p, s, N, K, b)
          torch.ops.trit.ternary_mm_a8_prologue(torch.cat([x, x], 1), None, None, 0.0, 2, p, s, N, K, None)
          torch.ops.trit.ternary_decode(p, s, N, K, dt)
      torch.ops.trit.ternary_decode(p, None, N, K, torch.int8)
torch.cuda.synchronize()
print("driver done")
PYEOF
  # SAN_TIMEOUT (default 300 s per tool): run 20's racecheck needed more than 120 s once the deep
  # rings and the M = 300 wgmma shape joined the driver (run 19: < 110 s without them); run 22's
  # more than 200 s once the driver also called ternary_mm_a8q (its rerun finished within 390 s).
  # The whole job must fit a device call's 600 s: run the bench as its own call when it is long.
  # racecheck also instruments the cuBLAS kernels the large-M routes call; run 10 saw it report
  # hazards inside cuBLAS's own nvjet_* GEMM (a bf16 large-M a8 route, since removed), NVIDIA's code, not
  # ours. Hazards count against us only when the reported kernel is not a cuBLAS one.
  # SAN_TOOLS picks the tools (default both): racecheck alone can be its own device call
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    echo "--- $tool" | tee -a "$OUT/sanitizer.txt"
    TRIT_KERNEL=${SAN_KERNEL:-v5} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-300} compute-sanitizer --tool $tool --error-exitcode 9 \
      $PY /tmp/trit_sanitize_driver.py > /tmp/san-$tool.txt 2>&1
    st=$?
    tail -25 /tmp/san-$tool.txt | tee -a "$OUT/sanitizer.txt"
    if [ $st -ne 0 ] && [ $tool = racecheck ] && grep -q "^driver done" /tmp/san-$tool.txt \
       && ! grep -E "Race reported|Error:" /tmp/san-$tool.txt | grep -vqE "nvjet_|cutlass|xmma|cublas"; then
      echo "racecheck: every hazard is inside a cuBLAS kernel ($(grep -oE "(nvjet|cutlass|xmma)[A-Za-z0-9_]*" /tmp/san-$tool.txt | sort -u | tr '\n' ' ')): none in ours" | tee -a "$OUT/sanitizer.txt"
      st=0
    fi
    if [ $st -eq 124 ]; then  # killed by timeout: the driver did not finish, so no verdict either way
      echo "$tool TIMED OUT after ${SAN_TIMEOUT:-300} s before the driver finished: no verdict (raise SAN_TIMEOUT)" | tee -a "$OUT/sanitizer.txt"
      rc=1
    elif [ $st -ne 0 ]; then
      echo "$tool FAILED" | tee -a "$OUT/sanitizer.txt"; rc=1
    fi
  done
fi

if has ncu && command -v ncu >/dev/null; then
  # NCU_M (default 1): the rows of x, e.g. 32 for the B = 32 decode GEMV (a8 MT = 4; the fp op is not a small
  # kernel there); at M <= 32 the bitplane layout's kernel (ternary_mm_a8_bp) is profiled beside the a8 one.
  # NCU_SHAPES (default 28672x8192,2560x2560): the N x K layers profiled, e.g. 14336x4096,4096x14336 (any number: the
  # first shape runs twice and its second round is profiled, each later shape once)
  # NCU_FULL=1: also the full metric set as CSV (ncu-raw.csv) and its summary (ncu-summary.txt)
  step "ncu: small-M kernels, M=${NCU_M:-1} (speed of light, occupancy, warp stalls)"
  cat > /tmp/trit_ncu_driver.py <<'PYEOF'
import os
import torch
from trit import ops
M = int(os.environ.get("NCU_M", "1"))
SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ.get("NCU_SHAPES", "28672x8192,2560x2560").split(",")]
for i, (N, K) in enumerate(SHAPES):
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
    p, s = ops.repack(w), torch.rand(N, device="cuda")
    bp = ops.repack_bitplane(p) if M <= 32 else None
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    for _ in range(2 if i == 0 else 1):
        torch.ops.trit.ternary_mm(x, p, s, N, K, None)
        torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
        if bp is not None:
            torch.ops.trit.ternary_mm_a8_bp(x, bp, s, N, K, None)
torch.cuda.synchronize()
PYEOF
  # small kernels per (shape, round): the fp GEMV at M <= 8, the a8 one, the bitplane one at M <= 32; skip the
  # first round of the first shape (warm-up), profile its second round and the one round of every later shape
  m=${NCU_M:-1}; nk=$(( (m <= 8 ? 1 : 0) + 1 + (m <= 32 ? 1 : 0) ))
  ns=$(echo "${NCU_SHAPES:-28672x8192,2560x2560}" | tr ',' '\n' | grep -c x)
  if [ "${NCU_FULL:-0}" = 1 ]; then
    # NCU_FULL=1: every metric of the full set as one CSV row per kernel, and bench/ncu_raw.py's summary of it
    # (stall reasons per issued instruction, L1 / L2 traffic and hit rates, the tensor pipe)
    ncu_run ncu-raw.csv /tmp/trit_ncu_driver.py -k regex:${NCU_KERNELS:-small_kernel} -s $nk -c $((ns * nk)) \
      --set full --page raw --csv
    $PY bench/ncu_raw.py "$OUT/ncu-raw.csv" > "$OUT/ncu-summary.txt" 2>&1 || true
    cat "$OUT/ncu-summary.txt"
  fi
  ncu_run ncu.txt /tmp/trit_ncu_driver.py -k regex:${NCU_KERNELS:-small_kernel} -s $nk -c $((ns * nk)) \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section InstructionStats \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables
  grep -E "small_kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Stall|Warp Cycles Per Issued|Executed Instructions |L1/TEX Hit Rate|L2 Hit Rate|Mem Busy|Max Bandwidth" "$OUT/ncu.txt" | head -100
fi

if has ncuquant && command -v ncu >/dev/null; then
  # the activation quantizer (quant_rows_perm_kernel) alone at M = 1 for growing K: run 22 put its
  # cost in front of the M = 1 GEMV at 0.7 us (K = 2560) to 7.4 us (K = 28672); where the time goes
  # (stall reasons per source line: the loads, the barriers, the stores)
  step "ncu: the a8 quantizer at M = 1"
  cat > /tmp/trit_ncu_quant.py <<'PYEOF'
import torch
from trit import ops
for K in (2560, 4096, 14336, 28672):
    N = 256
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
    p, s = ops.repack(w), torch.rand(N, device="cuda")
    x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    for _ in range(2):
        torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
torch.cuda.synchronize()
PYEOF
  TRIT_A8_FUSEQ=0 ncu_run ncu-quant.txt /tmp/trit_ncu_quant.py -k regex:quant_rows -c 8 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters
  grep -E "quant_rows|Duration|Memory Throughput|Grid Size|Block Size|Warp Cycles Per Issued|Stall|Uncoalesced" "$OUT/ncu-quant.txt" | head -80
fi

if has ncuactq && command -v ncu >/dev/null; then
  # TRIT_ACT_QUANT's cluster quantizer (quant_rows_cluster_kernel kAct: silu(gate) * up quantized in the kernel)
  # against the plain quantizer it replaces (TRIT_A8_FUSEQ=0: the quantizer its own launch at every M), on the
  # same rows: H200 run 62 timed kAct at 7.8 - 11.6 us by CUPTI where the plain one took 2.9 - 4.0 us (+ Inductor's
  # SiLU-mul 0.9 - 2.4 us; H100 run 93: 2x on the same grid). Per launch: duration, registers, occupancy, memory
  # throughput, issue rate, instruction counts (InstructionStats), branch counts (SourceCounters) and, with
  # --print-details all, the warp stall breakdown. No per-line view: the prebuilt's source path does not exist on
  # the device. Order per case: plain, then kAct (ncu -c counts both).
  step "ncu: the act quantizer (kAct) vs the plain a8 quantizer, M = 1 / 32"
  cat > /tmp/trit_ncu_actq.py <<'PYEOF'
import os
import torch
import torch.nn.functional as F
from trit import ops
for M, N, K in ((1, 2560, 6912), (32, 2560, 6912), (1, 4096, 14336), (32, 4096, 14336)):
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
    p, s = ops.repack(w), torch.rand(N, device="cuda") + 0.5
    x = (torch.randn(M, 2 * K, device="cuda") * 2).to(torch.bfloat16)
    h = (F.silu(x[:, :K]) * x[:, K:]).contiguous()
    torch.cuda.synchronize()
    os.environ["TRIT_ACT_QUANT"] = "0"
    torch.ops.trit.ternary_mm_a8(h, p, s, N, K, None)
    torch.cuda.synchronize()
    os.environ["TRIT_ACT_QUANT"] = "1"
    torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, 2, p, s, N, K, None)
    torch.cuda.synchronize()
PYEOF
  TRIT_A8_FUSEQ=0 NCU_TIMEOUT=${NCU_TIMEOUT:-200} ncu_run ncu-actq.txt /tmp/trit_ncu_actq.py -k regex:quant_rows -c 8 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section SourceCounters --section SchedulerStats --section InstructionStats \
    --print-details all
  grep -E "quant_rows|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions |Issued Warp|Branch Instructions  " "$OUT/ncu-actq.txt" | head -120
fi

if has ncunorm && command -v ncu >/dev/null; then
  # trit::rms_norm_a8q alone at M = 1 (no PDL-triggering kernel before it, so ncu's duration is the
  # kernel's own): run 24 put it at 2.7 us on the norm -> GEMV chain for K = 2560 and 5-9.5 us for
  # K = 6912-14336, where Inductor's norm kernels took ~2 us; where the time goes per source line
  step "ncu: rms_norm_a8q at M = 1"
  cat > /tmp/trit_ncu_norm.py <<'PYEOF'
import torch
from trit import ops  # noqa: F401  (registers torch.ops.trit)
for K in (2560, 4096, 6912, 14336):
    x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    r = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    w = torch.rand(K, device="cuda").to(torch.bfloat16)
    for _ in range(2):
        torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6)
torch.cuda.synchronize()
PYEOF
  ncu_run ncu-norm.txt /tmp/trit_ncu_norm.py -k regex:rms_norm_quant -c 8 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters
  grep -E "rms_norm_quant|Duration|Memory Throughput|Registers|Warp Cycles Per Issued|Stall" "$OUT/ncu-norm.txt" | head -80
fi

if has ab && [ "${ab_ok:-0}" = 1 ]; then
  # same-run A/B of bench.chain against older trees: AB_TAR lists one or more `git archive`s of a commit's csrc
  # trit bench reference ci pyproject.toml (carried in .ab/, git-ignored; space- or comma-separated, e.g. the
  # commits of a bisect), each built in its own directory (started before the build stage), then AB_REPS
  # (default 2) rounds of every old tree in the order given and this tree last (AB_ARGS, default the three
  # M = 1 tails with the chain and fnorm; AB_TIMEOUT s per bench, default 150). NAME: the archive's name
  # without .tar.gz; this tree: new. Raw outputs in $AB_DIR/ab-NAME-ROUND.txt; $OUT/ab.txt gets the builds'
  # last lines, every bench's table rows and the summary table (bench/ab_summary.py)
  step "chain A/B against ${AB_TAR}"
  for p in $ab_pids; do wait $p || rc=1; done
  for n in $ab_names; do tail -n 3 "$AB_DIR/build-$n.txt"; done | tee -a "$OUT/ab.txt"
  ab_args=${AB_ARGS:---tails 2b,8b,8b-llama --variants chain,fnorm}
  for i in $(seq 1 ${AB_REPS:-2}); do
    for n in $ab_names new; do
      if [ $n = new ]; then run=(); else run=(in_old $n); fi
      chain_round "$AB_DIR/ab-$n-$i" "$OUT/ab.txt" "$n bench $i" ${AB_TIMEOUT:-150} "$n $i " $ab_args
    done
  done
  if [ -f bench/ab_summary.py ]; then
    echo | tee -a "$OUT/ab.txt"
    python3 bench/ab_summary.py "$AB_DIR" --trees "$(echo $ab_names new | tr ' ' ',')" 2>&1 | tee -a "$OUT/ab.txt"
  fi
fi

if has ncuchain && command -v ncu >/dev/null; then
  # the chain kernel on one tail (NCU_TAIL, default 8b) at M = 1 under ncu: kernel totals (duration, executed
  # instructions, registers, stalls) and executed instructions per CUDA source line, for this tree and - when
  # the ab stage ran in the same call - every AB_TAR tree, compared line by line (bench/ncu_lines.py, the first
  # tree the reference); all into $OUT/ncu-chain.txt
  step "ncu: chain kernel, ${NCU_TAIL:-8b} tail (new${ab_names:+ vs$ab_names})"
  cat > /tmp/trit_ncu_chain.py <<'PYEOF'
import os
import torch
from trit import ops  # noqa: F401  (registers torch.ops.trit)
from bench.chain import TAILS, make_tails
name = os.environ.get("NCU_TAIL", "8b")
t = make_tails(name, 1)[0]
D, A = TAILS[name][0], TAILS[name][1]
x = torch.randn(1, A, device="cuda").to(torch.bfloat16)
r = torch.randn(1, D, device="cuda").to(torch.bfloat16)
for _ in range(3):  # ncu -s 2 -c 1: the third call
    torch.ops.trit.ternary_chain(x, r, 1, t["nw"], t["acts"], t["packed"], t["scales"], t["Ns"], t["Ks"], 1e-6)
torch.cuda.synchronize()
PYEOF
  csvs=""; cnames=""
  for n in ${ab_names:-} new; do
    if [ $n = new ]; then run=(env PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}); else run=(in_old $n); fi
    rep=/tmp/ncu-chain-$n
    rm -f $rep.ncu-rep
    "${run[@]}" env NCU_TAIL=${NCU_TAIL:-8b} timeout ${NCU_TIMEOUT:-150} \
      ncu --clock-control none -k regex:chain_kernel -s 2 -c 1 --section SpeedOfLight --section LaunchStats \
      --section WarpStateStats --section InstructionStats --section SourceCounters -o $rep $PY /tmp/trit_ncu_chain.py \
      > $rep.log 2>&1 || { echo "ncu chain $n failed: $(tail -n 3 $rep.log | tr '\n' ' ')" | tee -a "$OUT/ncu-chain.txt"; rc=1; continue; }
    { echo "## $n"; ncu -i $rep.ncu-rep --print-summary none 2>&1 | grep -E "chain_kernel|Duration|DRAM Throughput|Registers Per|Executed Instructions |Warp Cycles Per Issued|No Eligible"; } | tee -a "$OUT/ncu-chain.txt"
    ncu -i $rep.ncu-rep --page source --csv --print-source cuda,sass > $rep.csv 2>/dev/null && { csvs="$csvs $rep.csv"; cnames="$cnames,$n"; }
  done
  [ -n "$csvs" ] && python3 bench/ncu_lines.py $csvs --names "${cnames#,}" --top ${NCU_TOP:-24} 2>&1 | tee -a "$OUT/ncu-chain.txt"
fi

if has sanchain; then
  # trit::ternary_chain's persistent kernel alone under memcheck, racecheck and synccheck (its grid
  # barrier, the shared staging of every stage, the tile accumulators): tails with awkward sizes, the 2B
  # tail, every dtype, with and without the residual / norms, a one-stage and a four-stage chain
  step "compute-sanitizer: ternary_chain"
  cat > /tmp/trit_san_chain.py <<'PYEOF'
import os
import torch
from trit import ops
def lin(n, k):
    return ops.repack(torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")), torch.rand(n, device="cuda") * 0.05
for (D, A, I) in ((264, 136, 200), (1000, 520, 1032), (2560, 2560, 6912)):
    for dt in (torch.bfloat16, torch.float32):
        nw = lambda k: (torch.rand(k, device="cuda") + 0.5).to(dt)
        (po, so), (pg, sg), (pd, sd), (pq, sq) = lin(D, A), lin(2 * I, D), lin(D, I), lin(A + 16, D)
        x, r = torch.randn(1, A, device="cuda").to(dt), torch.randn(1, D, device="cuda").to(dt)
        for act, sub in ((1, True), (2, False)):
            n3 = [nw(A) if sub else None, nw(D), nw(I) if sub else None]
            torch.ops.trit.ternary_chain(x, r, 1, n3, [0, 0, act], [po, pg, pd], [so, sg, sd], [D, 2 * I, D], [A, D, I], 1e-6)
        torch.ops.trit.ternary_chain(x, r, 1, [nw(A), nw(D), nw(I), nw(D)], [0, 0, 1, 0], [po, pg, pd, pq],
                                     [so, sg, sd, sq], [D, 2 * I, D, A + 16], [A, D, I, D], 1e-6)
        torch.ops.trit.ternary_chain(x, None, -1, [None], [0], [po], [so], [D], [A], 1e-6)
        for m in (3, 8):  # above M = 1: the composed route (prologue ops per stage)
            xm, rm = torch.randn(m, A, device="cuda").to(dt), torch.randn(m, D, device="cuda").to(dt)
            torch.ops.trit.ternary_chain(xm, rm, 1, [nw(A), nw(D), nw(I)], [0, 0, 1], [po, pg, pd], [so, sg, sd],
                                         [D, 2 * I, D], [A, D, I], 1e-6)
        if dt == torch.bfloat16 and D in (264, 2560):  # bulk-copy input rows, 8-block chunks, gate / up unpaired
            for k, v in (("TRIT_CHAIN_TMA", "1"), ("TRIT_CHAIN_CU", "8"), ("TRIT_CHAIN_PAIR", "0"), ("TRIT_ACT_MUL", "1"),
                         ("TRIT_CHAIN_EARLY", "0")):
                os.environ[k] = v
                torch.ops.trit.ternary_chain(x, r, 1, [nw(A), nw(D), nw(I)], [0, 0, 1], [po, pg, pd], [so, sg, sd],
                                             [D, 2 * I, D], [A, D, I], 1e-6)
                x9, r9 = x.repeat(9, 1), r.repeat(9, 1)  # M = 9: the composed route (act_mul_kernel)
                torch.ops.trit.ternary_chain(x9, r9, 1, [nw(A), nw(D), nw(I)], [0, 0, 1], [po, pg, pd], [so, sg, sd],
                                             [D, 2 * I, D], [A, D, I], 1e-6)
                del os.environ[k]
torch.cuda.synchronize()
print("driver done")
PYEOF
  for tool in ${SAN_CHAIN_TOOLS:-memcheck racecheck synccheck}; do
    echo "--- chain $tool" | tee -a "$OUT/sanitizer.txt"
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-300} compute-sanitizer --tool $tool --error-exitcode 9 \
      $PY /tmp/trit_san_chain.py > /tmp/san-chain-$tool.txt 2>&1
    st=$?
    tail -8 /tmp/san-chain-$tool.txt | tee -a "$OUT/sanitizer.txt"
    [ $st -eq 0 ] || { echo "chain $tool FAILED ($st)" | tee -a "$OUT/sanitizer.txt"; rc=1; }
  done
fi

if has ncupro && command -v ncu >/dev/null; then
  # trit::ternary_mm_a8_prologue's one kernel at M = 1 (residual + norm) beside the plain fused-quantizer GEMV
  # on the same shapes: H200 run 25b timed the prologue 2.4-8.9 us above the GEMV alone; where it goes
  step "ncu: ternary_mm_a8_prologue vs the fused-quantizer GEMV at M = 1"
  cat > /tmp/trit_ncu_pro.py <<'PYEOF'
import os
import torch
from trit import ops
for N, K in ((2560, 2560), (4096, 4096)):
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
    p, s = ops.repack(w), torch.rand(N, device="cuda")
    x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    r = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    nw = (torch.rand(K, device="cuda") + 0.5).to(torch.bfloat16)
    os.environ["TRIT_A8_FUSEQ"] = "1"
    for _ in range(2):
        torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
        torch.ops.trit.ternary_mm_a8_prologue(x, r, nw, 1e-6, 0, p, s, N, K, None)
torch.cuda.synchronize()
PYEOF
  ncu_run ncu-pro.txt /tmp/trit_ncu_pro.py -k regex:a8_small_kernel -c 8 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section Occupancy
  grep -E "a8_small_kernel|Duration|Memory Throughput|L2 Hit|Registers|Block Size|Grid Size|Dynamic Shared|Warp Cycles Per Issued|Achieved Occupancy" "$OUT/ncu-pro.txt" | head -80
fi

if has ncugemm && command -v ncu >/dev/null; then
  # the a8 GEMM kernel at M = 64 / 128, its mma.sync loop against the wgmma loops (TRIT_A8_GEMM_WG,
  # _OVERLAP), one launch each after a warm-up, split-K off so that one CTA's loop is what is timed
  step "ncu: a8 GEMM kernel, mma.sync vs wgmma loops"
  cat > /tmp/trit_ncu_gemm.py <<'PYEOF'
import os
import torch
from trit import ops
os.environ.update({"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_KS": "1"})
for N, K in ((28672, 8192), (2560, 2560)):
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
    p, s = ops.repack(w), torch.rand(N, device="cuda")
    for M in (64, 128):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        for wg, ov in (("0", "0"), ("1", "0"), ("1", "1"), ("2", "1")):
            os.environ.update({"TRIT_A8_GEMM_WG": wg, "TRIT_A8_GEMM_WG_OVERLAP": ov})
            for _ in range(2):
                torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
torch.cuda.synchronize()
PYEOF
  NCU_TIMEOUT=${NCU_TIMEOUT:-200} ncu_run ncu-gemm.txt /tmp/trit_ncu_gemm.py -k regex:a8_gemm_kernel -c 32 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats
  grep -E "a8_gemm_kernel|Duration|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued" "$OUT/ncu-gemm.txt" | head -120
fi

if has bench; then
  step "bench"
  # a failed test or sanitizer stage above: leave the not-yet-validated variants out, so that a
  # kernel fault in one of them cannot end the whole bench
  extra=""; [ $rc -ne 0 ] && extra="--no-experimental" && echo "earlier stage failed: bench $extra"
  timeout ${BENCH_TIMEOUT:-480} $PY -m bench.kernels --out "$OUT" $BENCH_ARGS $extra || rc=1
fi
if has chain; then
  # bench.chain in this tree, CHAIN_REPS (default 2) rounds of CHAIN_ARGS (default: the Llama and 2B tails at M = 16 /
  # 32, the e2e routes with Inductor's glue), each round's table rows into $OUT/chain.txt (its records stay in
  # $AB_DIR: the device returns at most 8 files)
  step "bench.chain"
  chain_args=${CHAIN_ARGS:---tails 8b-llama,2b --ms 16,32 --variants a8-inductor,fnorm-inductor,fnorm-tiled-inductor}
  mkdir -p "$AB_DIR"
  for i in $(seq 1 ${CHAIN_REPS:-2}); do
    echo "round $i: python -m bench.chain $chain_args" >> "$OUT/chain.txt"
    run=(); chain_round "$AB_DIR/chain-$i" "$OUT/chain.txt" "bench.chain round $i" ${CHAIN_TIMEOUT:-150} "" $chain_args
  done
fi
if has readfloor; then
  # the reachable floor: a read-only kernel over each shape's packed bytes (bench/read_floor.py), beside the
  # M = 1 rows of the bench record this call wrote (if any)
  step "read floor"
  krec=$(ls -t "$OUT"/*-h200*.json "$OUT"/20*.json 2>/dev/null | grep -v -e read-floor -e partial- | head -1)
  timeout ${FLOOR_TIMEOUT:-240} $PY -m bench.read_floor --out "$OUT" --shapes ${FLOOR_SHAPES:-2b,8b,70b} \
    ${krec:+--kernels "$krec"} || rc=1
fi
if has actq; then
  # Llama's SiLU-mul inside down_proj's quantizer (TRIT_ACT_QUANT) against Inductor's SiLU-mul + ternary_mm_a8
  # (bench/act_quant.py: op times, each kernel by CUPTI, a bit-exactness check); ACTQ_ARGS e.g. --cases 32:4096x14336
  step "act-quant"
  timeout ${ACTQ_TIMEOUT:-300} $PY -X faulthandler -m bench.act_quant --out "$OUT" ${ACTQ_ARGS:-} || rc=1
fi
if has normq; then
  # the fused-norm route's kernels (rms_norm_a8q and the GEMV on its quantization) by CUPTI with PDL off, beside the
  # default's quantizer + GEMV (bench.x_footprint --no-scale --norm; a case past --watchdog prints its stacks)
  step "norm + quantizer kernels"
  timeout ${NORMQ_TIMEOUT:-300} $PY -X faulthandler -m bench.x_footprint --no-scale --norm --out "$OUT" \
    --cases ${NORMQ_CASES:-32:6144x4096,32:28672x4096,32:3840x2560,32:13824x2560,16:8192x8192,64:14336x4096} || rc=1
fi
if has normc; then
  # rms_norm_a8q under TRIT_RNQ_CLUSTER (the one-CTA kernel, the row over a cluster of CTAs) against Inductor's
  # add + RMSNorm and the a8 quantizer it replaces, each kernel by CUPTI with PDL off, outputs checked
  # (bench/norm_quant.py; NORMC_ARGS e.g. --cases 32:4096 --clusters 0,2)
  step "rms_norm_a8q cluster variants"
  timeout ${NORMC_TIMEOUT:-240} $PY -X faulthandler -m bench.norm_quant --out "$OUT" ${NORMC_ARGS:-} || rc=1
fi
if has a8split; then
  # the a8 op at 16 < M <= 256 split into its quantizer and GEMM kernel (CUPTI, PDL off) and the op (graph, PDL
  # on), default launch and split-K forced (bench/a8_breakdown.py; A8SPLIT_ARGS e.g. --cases 128:2560x2560 --ks 2,4)
  step "a8 GEMM route breakdown"
  timeout ${A8SPLIT_TIMEOUT:-300} $PY -X faulthandler -m bench.a8_breakdown --out "$OUT" ${A8SPLIT_ARGS:-} || rc=1
fi
step "done rc=$rc"
exit $rc
