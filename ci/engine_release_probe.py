"""GPU check of the vllm target's engine release (parity.targets.vllm, one_model_at_a_time): an fp32 eager engine on
models/tiny-bitnet generates, close() shuts it down, the free device memory is printed before and after, nothing
may keep the LLM or its engine core alive, and a new target's engine must generate the same tokens. Run it in
ci/gpu_e2e.sh's environment (TRIT_PREBUILT, VLLM_USE_FLASHINFER_SAMPLER=0, ...); record: bench/results/
2026-12-05-h100-run69ef-engine-release.txt."""
import gc, weakref, torch, time
from parity.targets import get_target
t0=time.time()
ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
t = get_target("vllm", compute_dtype="fp32"); print("one_model_at_a_time", t.one_model_at_a_time, flush=True)
llm = t.llm("models/tiny-bitnet")
w, wc = weakref.ref(llm), weakref.ref(llm.llm_engine.engine_core)
del llm
first = t.generate("models/tiny-bitnet", ids, 4)
print("free before close GiB", torch.cuda.mem_get_info()[0]/2**30, time.time()-t0, flush=True)
t.close()
print("free after close GiB", torch.cuda.mem_get_info()[0]/2**30, "ALIVE", w() is not None, wc() is not None, time.time()-t0, flush=True)
if w() is not None:
    for r in gc.get_referrers(w()):
        print(" referrer", type(r), str(r)[:300], flush=True)
if wc() is not None:
    for r in gc.get_referrers(wc()):
        print(" core referrer", type(r), str(r)[:300], flush=True)
t2 = get_target("vllm", compute_dtype="fp32")
print("SAME", torch.equal(first, t2.generate("models/tiny-bitnet", ids, 4)), time.time()-t0, flush=True)
