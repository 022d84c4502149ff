#!/usr/bin/env bash
# GPU end-to-end job (issue 6), in stages that each fit one device call (<= 10 min):
#   ci/gpu_e2e.sh setup      install the staged vLLM 0.26 bundle (staging: see ci/gpu_vllm.sh), build the trit ops
#   ci/gpu_e2e.sh parity     vLLM parity record of the bundled tiny model (eager capture + CUDA graphs)
#   ci/gpu_e2e.sh innorm     use_rms_norm (an input RMSNorm inside every linear): tiny-bitnet with norms, its
#                            goldens, vLLM parity record, tests/test_input_norm.py's vLLM tests (needs pytest:
#                            carry .whl)
#   ci/gpu_e2e.sh probe      ci/chain_route_probe.py: TRIT_CHAIN=${PROBE_MODES:-1} against the default on the
#                            tiny model (~1 min a mode): does the one-token routing compile on this vLLM
#   ci/gpu_e2e.sh scale      BitNet-2B-shaped model: fp32 goldens + bf16 noise floor on the GPU, vLLM parity record
#                            (SCALE_PRESET=llama-2b-twin: its Llama twin instead)
#   ci/gpu_e2e.sh gen2b      generate the three 2B-shaped models (BitNet, its Llama twin, the bf16 twin) at
#                            once (e2e2b generates what is missing one after the other: > 570 s with humming)
#   ci/gpu_e2e.sh e2e2b      bench.e2e --shape 2b (ours on BitNet + Llama twin, bf16 twin)
#   ci/gpu_e2e.sh floor      bench.e2e --shape tiny: vLLM's own time per decode step on this host (a model whose
#                            forward takes microseconds), the floor under every B = 1 figure; e2e2b / e2e8b
#                            after it on the same machine add python -m bench.ceiling of their record
#   ci/gpu_e2e.sh tp2        tensor parallel 2 (two GPUs): parity record (tiny) + bench.e2e 8b at TP=2
#   ci/gpu_e2e.sh gold8b     Llama-3-8B-shaped model: fp32 goldens + bf16 noise floor on the GPU
#   ci/gpu_e2e.sh scale8b    gold8b (when missing), then parity records at TP=1 and TP=2
#                            (SCALE_TPS="1" or "2" for one of them: goldens + noise + TP=1 took 585 s)
#   ci/gpu_e2e.sh gen8b      generate the Llama-3-8B-shaped ternary + bf16 models, the two at once (its
#                            own call: one e2e8b call that also generated them ran past 470 s)
#   ci/gpu_e2e.sh e2e8b      bench.e2e --shape 8b (ours, bf16)
#   ci/gpu_e2e.sh condcache  does vLLM's compile cache keep the one-token route's torch.cond piece here: the 2B
#                            twin under ${CC_ONLY:-ours-llama-fnorm1} loaded twice (B = 1) from one fresh
#                            VLLM_CACHE_ROOT with VLLM_USE_MEGA_AOT_ARTIFACT=${CC_MEGA:-1} (trit.vllm.quant.
#                            cond_pieces_cacheable keeps the cache on under it); the two load times side by side
# The e2e stages keep their rows in /tmp/e2e-state (bench.e2e --state): the same stage again, e.g.
# with E2E_ONLY=ours,bf16,ours-gemm,humming (ours-gemm: TRIT_A8_GEMM=1; humming's JIT takes
# minutes), measures only what is missing and writes one record with every config of this commit
# side by side.
# Several stages may be given in one call. Models and goldens are generated on the machine under
# /tmp (deterministic presets); results go to $OUT. TRIT_COMMIT names the commit in the records.
# GPU1_STAGES="..." runs those stages at the same time on the second GPU (CUDA_VISIBLE_DEVICES=1, log
# in $OUT/gpu1-log.txt), e.g. the 8B goldens beside a TP=1 e2e run; the call waits for both. They
# start at once, so the bundle must be set up (setup stage) by an earlier call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models /tmp/golden
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site/_pytest ]; then  # carried test wheels (pytest, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || true
fi
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 CUDA_HOME=/usr/local/cuda \
       TRIT_BUILD_DIR=/tmp/trit-build PYTHONUNBUFFERED=1
# NVLink multicast stays off on the shared hosts (device KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
export TRIT_COMMIT=${TRIT_COMMIT:-unknown}
# Hopper: build the trit ops for sm_90a even where the image presets a plain 9.0 (the wgmma loops)
[ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" = "9.0" ] && export TORCH_CUDA_ARCH_LIST=9.0a
quiet() { grep -vE "^\(EngineCore|^INFO|DEBUG|^\[rank|it/s\]|WARNING.*(deprecat|FutureWarning)" || true; }
rc=0
gpu1_pid=""
# ceiling SHAPE BASELINE TARGETS: where the floor stage ran on this machine earlier (its rows stay in
# /tmp/e2e-state-tiny), python -m bench.ceiling of this call's SHAPE record under it (a copy of the floor rows
# goes to $OUT with it); a record without the baseline is reported, not an error of the stage
ceiling() {
  local e f
  e=$(ls -t "$OUT"/*-e2e-$1.json "$OUT"/*-e2e-$1-[0-9]*.json 2>/dev/null | head -1)
  f=$(ls -t "${FLOOR_STATE:-/tmp/e2e-state-tiny}"/*.json 2>/dev/null | head -1)
  if [ -z "$e" ]; then echo "ceiling: no $1 record in $OUT"; return 0; fi
  if [ -z "$f" ]; then echo "ceiling: no floor rows on this machine (run the floor stage first)"; return 0; fi
  cp "$f" "$OUT/floor-rows-$(basename "$f" | sed 's/^partial-//')"
  python3 -m bench.ceiling --e2e "$e" --floor "$f" --baseline "$2" --targets "$3" --out "$OUT" | tail -8 || true
}
if [ -n "${GPU1_STAGES:-}" ]; then
  GPU1_STAGES="" CUDA_VISIBLE_DEVICES=1 bash "$0" $GPU1_STAGES > "$OUT/gpu1-log.txt" 2>&1 &
  gpu1_pid=$!
fi
step() { echo; echo "=== $* ($(date -u +%T))"; }
gen() {  # gen PRESET: the quantized checkpoint where bench.e2e also looks for it
  local d=/tmp/models/$1
  [ -f "$d/config.json" ] || python3 -m reference.make_model --preset "$1" --out "$d" --dtype bf16 >/dev/null
  echo "$d"
}

for stage in "$@"; do
  case $stage in
    setup)
      step setup
      if [ ! -d /tmp/site/vllm ] && compgen -G "/tmp/vstage/wheels.tar.part*" >/dev/null; then
        ( cd /tmp/vstage && cat wheels.tar.part* > wheels.tar && sha256sum -c wheels.sha256 && mkdir -p w \
          && tar -xf wheels.tar -C w && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site w/*.whl ) || exit 1
      elif [ ! -d /tmp/site/vllm ]; then
        # ../shared/gpu/make-vllm-bundle's chunks (.gpu-bundle/c1..c6: the vLLM wheel in five parts, then the
        # other wheels and vllm.sha256), each staged by an earlier run of the same machine into /tmp/vstage
        ( cd /tmp/vstage && cat vllm-*.whl.part0? > vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl \
          && sha256sum -c vllm.sha256 && rm vllm-*.whl.part0? \
          && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site *.whl ) || exit 1
      fi
      # the plugin's entry point (pyproject's vllm.general_plugins), so that processes vLLM starts itself
      # (the engine core with bench.e2e --engine mp, TP workers under spawn) register trit too; this
      # repository is on PYTHONPATH, the dist-info only names the entry point
      di=/tmp/site/trit_parity-0.1.0.dist-info
      mkdir -p $di && printf 'Metadata-Version: 2.1\nName: trit-parity\nVersion: 0.1.0\n' > $di/METADATA \
        && printf '[vllm.general_plugins]\ntrit = trit.vllm:register\n' > $di/entry_points.txt
      python3 -c "from importlib.metadata import entry_points as e; assert any(p.name == 'trit' for p in e(group='vllm.general_plugins')), 'trit entry point not found'" || exit 1
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
      python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
      python3 -c "import trit.ops as o; assert o.EXTENSION_LOADED, o.EXTENSION_ERROR; print('trit ext loaded')" || exit 1
      ;;
    parity)
      step "parity: tiny-bitnet"
      python3 -m bench.vllm_parity --out "$OUT" 2>&1 | quiet | tail -40 || rc=1
      ;;
    innorm)
      # transformers' use_rms_norm (an input RMSNorm inside every BitLinear): tiny-bitnet with per-module norm
      # weights (reference.make_model.to_rms_norm), its goldens, the vLLM parity record (eager capture, then CUDA
      # graphs on) and the vLLM tests of tests/test_input_norm.py (fp32; TP 2 needs two GPUs: skipped here)
      step "innorm: tiny-bitnet with use_rms_norm"
      M=/tmp/models/tiny-bitnet-rms
      [ -f $M/config.json ] || { rm -rf $M && cp -r models/tiny-bitnet $M \
        && python3 -c "from reference.make_model import to_rms_norm; to_rms_norm('$M', seed=1)"; } || rc=1
      [ -f /tmp/golden/tiny-bitnet-rms/manifest.json ] || python3 -m parity.dump --ref --model $M \
        --out /tmp/golden/tiny-bitnet-rms --device cuda || rc=1
      # its bf16 noise floor (parity.noise): a module norm in front of every linear adds a bf16 rounding and int8
      # flips before each quantizer: an independent bf16 implementation already sits at 0.32 of layer3.mlp.down_proj
      # (plain tiny-bitnet: 0.20; CPU figures) against a static limit of 0.36; vLLM measured 0.45 there (run 69b)
      [ -f /tmp/golden/tiny-bitnet-rms/noise-bf16.json ] || python3 -m parity.noise --model $M \
        --golden /tmp/golden/tiny-bitnet-rms --target-opt device=cuda || rc=1
      python3 -m bench.vllm_parity --model $M --golden /tmp/golden/tiny-bitnet-rms --out "$OUT" 2>&1 | quiet | tail -50 || rc=1
      python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_input_norm.py -m vllm -k "not tp2" \
        --junitxml="$OUT/innorm-junit.xml" 2>&1 | quiet | tail -15 || rc=1
      ;;
    probe)
      step "probe: TRIT_CHAIN modes on the tiny model under this vLLM (compile + CUDA graphs)"
      python3 ci/chain_route_probe.py --out "$OUT" --modes ${PROBE_MODES:-1} 2>&1 | tail -8 || rc=1
      ;;
    scale)
      # SCALE_PRESET: the 2B-shaped model to check (default bitnet-2b; llama-2b-twin: the Llama twin, the
      # architecture the Llama-only routes - TRIT_ACT_QUANT, the Llama chain - run on)
      SP=${SCALE_PRESET:-bitnet-2b}
      step "scale: $SP goldens + parity"
      M=$(gen "$SP")
      [ -f /tmp/golden/$SP/manifest.json ] || python3 -m parity.dump --ref --model "$M" --out /tmp/golden/$SP --device cuda --no-floor || rc=1
      # the bf16 noise floor of this golden set (independent bf16 implementation), see parity/noise.py
      [ -f /tmp/golden/$SP/noise-bf16.json ] || python3 -m parity.noise --model "$M" --golden /tmp/golden/$SP --target-opt device=cuda || rc=1
      python3 -m bench.vllm_parity --model "$M" --golden /tmp/golden/$SP --out "$OUT" 2>&1 | quiet | tail -60 || rc=1
      ;;
    e2e2b)
      step "e2e 2b"
      python3 -m bench.e2e --shape 2b --only ${E2E_ONLY:-ours-bitnet,ours-llama,bf16-llama} --models /tmp/models \
        --out "$OUT" --state /tmp/e2e-state ${E2E_ARGS:-} 2>&1 | quiet | tail -60 || rc=1
      ceiling 2b bf16-llama 1=2.5,32=1.8
      ;;
    tp2)
      step "tensor parallel 2"
      # The 2B shape has 5 KV heads: vLLM refuses TP=2 for it ("5 is not divisible by 2"), bf16 too.
      # TP=2 at scale therefore runs on the Llama-3-8B shape (8 KV heads): e2e throughput here,
      # parity (fp32 goldens of an 8B model) in the scale8b stage.
      python3 -m bench.vllm_parity --tp 2 --out "$OUT" 2>&1 | quiet | tail -25 || rc=1
      python3 -m bench.e2e --shape 8b --tp 2 --only ours,bf16 --models /tmp/models --out "$OUT" --state /tmp/e2e-state \
        ${E2E_ARGS:-} 2>&1 | quiet | tail -30 || rc=1
      ;;
    gold8b|scale8b)
      step "$stage: llama3-8b goldens + noise floor (scale8b: + parity)"
      M=$(gen llama3-8b)
      [ -f /tmp/golden/llama3-8b/manifest.json ] || python3 -m parity.dump --ref --model "$M" --out /tmp/golden/llama3-8b --device cuda --no-floor || rc=1
      [ -f /tmp/golden/llama3-8b/noise-bf16.json ] || python3 -m parity.noise --model "$M" --golden /tmp/golden/llama3-8b --target-opt device=cuda || rc=1
      [ $stage = gold8b ] && continue
      for tp in ${SCALE_TPS:-1 2}; do  # SCALE_TPS="2": the TP=2 record alone (TP=1 + goldens: ~585 s)
        python3 -m bench.vllm_parity --tp $tp --model "$M" --golden /tmp/golden/llama3-8b --out "$OUT" 2>&1 | quiet | tail -25 || rc=1
      done
      ;;
    gen2b)
      step "gen 2b"
      python3 -m bench.e2e --shape 2b --only ours-bitnet --models /tmp/models --gen-only & p1=$!
      python3 -m bench.e2e --shape 2b --only ours-llama --models /tmp/models --gen-only & p2=$!
      python3 -m bench.e2e --shape 2b --only bf16-llama --models /tmp/models --gen-only || rc=1
      wait $p1 || rc=1
      wait $p2 || rc=1
      ;;
    gen8b)
      step "gen 8b"
      # the two checkpoints at once (each single-threaded for much of its time: ~150 + 75 s one after the other)
      python3 -m bench.e2e --shape 8b --only ours --models /tmp/models --gen-only & p1=$!
      python3 -m bench.e2e --shape 8b --only bf16 --models /tmp/models --gen-only || rc=1
      wait $p1 || rc=1
      ;;
    e2e8b)
      step "e2e 8b"
      python3 -m bench.e2e --shape 8b --only ${E2E_ONLY:-ours,bf16} --models /tmp/models --out "$OUT" \
        --state /tmp/e2e-state ${E2E_ARGS:-} 2>&1 | quiet | tail -40 || rc=1
      ceiling 8b bf16 1=3.5,32=1.8
      ;;
    floor)
      # the engine's own time per decode step on this host: the bundled-size tiny model (4 layers, hidden
      # 128, vocab 512: a forward of tens of microseconds), so its step time is vLLM's host time per step -
      # the floor under any model's B = 1 figure here (the 2B model's B = 1 has been host-bound since run 7)
      step "floor: bench.e2e --shape tiny"
      python3 -m bench.e2e --shape tiny --only ${E2E_ONLY_TINY:-ours-bitnet,bf16-bitnet} --models /tmp/models \
        --out "$OUT" --state "${FLOOR_STATE:-/tmp/e2e-state-tiny}" ${E2E_ARGS:-} 2>&1 | quiet | tail -30 || rc=1
      ;;
    condcache)
      step "condcache: ${CC_ONLY:-ours-llama-fnorm1} loaded twice from one compile cache, VLLM_USE_MEGA_AOT_ARTIFACT=${CC_MEGA:-1}"
      rm -rf /tmp/cc-cache /tmp/cc-state-1 /tmp/cc-state-2
      for i in 1 2; do
        VLLM_CACHE_ROOT=/tmp/cc-cache VLLM_USE_MEGA_AOT_ARTIFACT=${CC_MEGA:-1} python3 -m bench.e2e --shape 2b \
          --only ${CC_ONLY:-ours-llama-fnorm1} --batches 1 --models /tmp/models --out "$OUT/condcache-$i" \
          --state /tmp/cc-state-$i 2>&1 | quiet | grep -E "^\| ${CC_ONLY:-ours-llama-fnorm1}|rror|serializ" | head -5 || rc=1
      done
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
if [ -n "$gpu1_pid" ]; then
  wait $gpu1_pid || rc=1
  echo "=== GPU 1 ($GPU1_STAGES), $OUT/gpu1-log.txt:"; tail -30 "$OUT/gpu1-log.txt"
fi
ls -la "$OUT"
exit $rc
