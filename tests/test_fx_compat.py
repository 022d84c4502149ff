"""trit.vllm.fx_compat: the graph fixes that let TRIT_CHAIN=1's torch.cond routing compile in vLLM 0.26 on
torch 2.11 (each piece's placeholders first; one copy of a shared SymBool predicate per user).

torch 2.13 (CI) no longer produces the broken forms itself, so the graphs here are built to have them:
each test fails without the fix it names."""
import operator
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx

from trit.vllm.fx_compat import localize_sym_predicates, placeholders_first

ROOT = Path(__file__).resolve().parent.parent


def _interleaved():
    """A graph as torch 2.11's split_module leaves a piece holding a cond: a get_attr between placeholders."""
    root = torch.nn.Module()
    root.w = torch.nn.Parameter(torch.full((3,), 2.0))
    g = fx.Graph()
    a = g.placeholder("a")
    w = g.get_attr("w")
    b = g.placeholder("b")
    c = g.placeholder("c")
    g.output(g.call_function(operator.add, (g.call_function(operator.mul, (a, w)), g.call_function(operator.sub, (b, c)))))
    return fx.GraphModule(root, g)


def _leading(gm):
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            break
        out.append(n.name)
    return out


def test_placeholders_first_keeps_signature_and_result():
    gm = _interleaved()
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    want = gm(a, b, c)
    assert _leading(gm) == ["a"]  # what vLLM 0.26's get_fake_args_from_graph would read: one input of three
    assert placeholders_first(gm) == 2
    assert _leading(gm) == ["a", "b", "c"]  # all of them, in the signature's order
    torch.testing.assert_close(gm(a, b, c), want, rtol=0, atol=0)
    assert placeholders_first(gm) == 0  # already in form: nothing moves


def _shared_predicate_graph():
    """Dynamo's graph of two conds on the same ``x.shape[0] == 1`` (one eq node for both)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        for k in (2.0, 3.0):
            x = torch.cond(x.shape[0] == 1, lambda t: t * k, lambda t: t + k, (x,))
        return x

    torch._dynamo.reset()
    x = torch.ones(4, 2)
    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(f, backend=backend, fullgraph=True)(x)
    torch._dynamo.reset()
    return graphs[0]


def test_localize_sym_predicates_gives_each_cond_its_own():
    gm = _shared_predicate_graph()
    symbool = lambda n: isinstance(n.meta.get("example_value"), torch.SymBool)  # noqa: E731
    preds = [n for n in gm.graph.nodes if n.op == "call_function" and symbool(n)]
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) == 2 and len(preds) == 1 and len(preds[0].users) == 2  # the form torch 2.11 choked on
    assert localize_sym_predicates(gm) == 1
    preds = [n for n in gm.graph.nodes if n.op == "call_function" and symbool(n)]
    assert len(preds) == 2 and all(len(p.users) == 1 for p in preds)
    assert conds[0].args[0] is not conds[1].args[0]  # each cond its own predicate, from the SymInt input
    assert all(symbool(c.args[0]) and all(i.op == "placeholder" for i in c.args[0].all_input_nodes) for c in conds)
    assert conds[1].args[0] is conds[1].prev  # the copy right in front of its cond (in that cond's piece)
    args = lambda m: [m if isinstance(n.meta.get("example_value"), torch.SymInt) else torch.ones(m, 2)  # noqa: E731
                      for n in gm.graph.nodes if n.op == "placeholder"]
    assert gm(*args(1))[0][0, 0].item() == 6.0  # (1 * 2) * 3: both one-token branches
    assert gm(*args(5))[0][0, 0].item() == 6.0  # (1 + 2) + 3
    assert gm(*args(5))[0].shape[0] == 5


def test_install_wraps_vllms_split_graph_once():
    pytest.importorskip("vllm")
    from vllm.compilation import backends

    from trit.vllm.fx_compat import install_split_graph_fix

    orig = getattr(backends.split_graph, "__wrapped__", backends.split_graph)
    try:
        assert install_split_graph_fix()
        wrapped = backends.split_graph
        assert wrapped.__wrapped__ is orig and wrapped._trit_placeholders_first
        assert install_split_graph_fix() and backends.split_graph is wrapped  # idempotent
    finally:
        backends.split_graph = orig


@pytest.mark.parametrize("route", ["closure", "args"])
def test_cond_split_repro_compiles_with_the_fix(route):
    """ci/cond_split_repro.py: the toy cond model through vLLM's split_graph (or torch's split_module) and
    Inductor, with the fix, equals eager at 8, 1 and 3 tokens (on torch 2.11 + vLLM 0.26 it fails without)."""
    p = subprocess.run([sys.executable, str(ROOT / "ci" / "cond_split_repro.py"), route, "fix"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "RESULT ok" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


def _disable_in(monkeypatch, mode, env_cached: bool, mega: str = "0"):
    """quant.disable_compile_cache() inside a vLLM config context of this compilation mode; env_cached: vLLM's
    variables cached already (envs.enable_envs_cache, as after an engine start), simulated; mega: vLLM's
    VLLM_USE_MEGA_AOT_ARTIFACT ("0" as on the GPU image, vLLM 0.26 + torch 2.11, where a cond piece cannot be
    cached; "1" the default with torch >= 2.12). Returns (what it reported, VLLM_DISABLE_COMPILE_CACHE as vLLM
    reads it, the Inductor dict)."""
    pytest.importorskip("vllm")
    from vllm import envs
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config

    from trit.vllm.quant import disable_compile_cache

    # set (to off) through monkeypatch, so that what the function writes there is undone after the test
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "0")
    monkeypatch.setenv("VLLM_USE_MEGA_AOT_ARTIFACT", mega)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    if env_cached:
        monkeypatch.setattr(envs, "__getattr__", lambda name: False if name == "VLLM_DISABLE_COMPILE_CACHE" else
                            envs.environment_variables[name]())
    cfg = VllmConfig(compilation_config=CompilationConfig(mode=getattr(CompilationMode, mode)))
    cfg.compilation_config.mode = getattr(CompilationMode, mode)  # the CPU platform swaps VLLM_COMPILE for one trace
    with set_current_vllm_config(cfg):
        how = disable_compile_cache()
        again = disable_compile_cache()
    assert again is None, again  # once off, nothing more to do
    return how, envs.VLLM_DISABLE_COMPILE_CACHE, dict(cfg.compilation_config.inductor_compile_config)


def test_disable_compile_cache_through_vllms_env(monkeypatch):
    """Under vLLM's piecewise compile the cache goes off through VLLM_DISABLE_COMPILE_CACHE (vLLM's own
    switch), not Inductor's force_disable_caches, which compiles every piece in a fresh cache directory and
    made the 2B model's load 4.5x longer on the H200 (e2e run 13)."""
    how, env_on, icc = _disable_in(monkeypatch, "VLLM_COMPILE", env_cached=False)
    assert how == "env" and env_on, (how, env_on)
    assert "force_disable_caches" not in icc, icc
    from vllm.compilation.compiler_interface import is_compile_cache_enabled
    assert not is_compile_cache_enabled(icc)


def test_disable_compile_cache_falls_back_to_inductor_key(monkeypatch):
    """Where vLLM has cached its variables already (a second engine in one process), the environment cannot
    reach it: the Inductor key instead, which vLLM's is_compile_cache_enabled reads too."""
    import os
    how, env_on, icc = _disable_in(monkeypatch, "VLLM_COMPILE", env_cached=True)
    assert how == "inductor" and not env_on and icc.get("force_disable_caches") is True, (how, env_on, icc)
    assert os.environ["VLLM_DISABLE_COMPILE_CACHE"] == "0"  # left as it was: child processes would inherit it
    from vllm.compilation.compiler_interface import is_compile_cache_enabled
    assert not is_compile_cache_enabled(icc)


@pytest.mark.parametrize("mode", ["NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE"])
def test_disable_compile_cache_only_under_piecewise_compile(monkeypatch, mode):
    """Outside vLLM's piecewise backend nothing is cached piecewise, and torch.compile would refuse the key
    as an Inductor option: untouched."""
    import os
    how, env_on, icc = _disable_in(monkeypatch, mode, env_cached=False)
    assert how is None and not env_on and "force_disable_caches" not in icc, (how, env_on, icc)
    assert os.environ["VLLM_DISABLE_COMPILE_CACHE"] == "0"


@pytest.mark.parametrize("env_cached", [False, True])
def test_compile_cache_kept_where_the_mega_aot_artifact_keeps_a_cond(monkeypatch, env_cached):
    """Where vLLM saves the compiled model as one mega AOT artifact (its default with torch >= 2.12), a piece
    holding a torch.cond is cached and loads back (tests/test_vllm_compiled.py's piecewise one-token tests), so
    the one-token routes keep vLLM's compile cache: nothing is turned off, neither the environment nor the
    Inductor key; with the artifact off (the GPU image's default, torch 2.11) it goes off as before."""
    import os

    from trit.vllm.quant import cond_pieces_cacheable
    how, env_on, icc = _disable_in(monkeypatch, "VLLM_COMPILE", env_cached=env_cached, mega="1")
    assert cond_pieces_cacheable()
    assert how is None and not env_on and "force_disable_caches" not in icc, (how, env_on, icc)
    assert os.environ["VLLM_DISABLE_COMPILE_CACHE"] == "0"
    from vllm.compilation.compiler_interface import is_compile_cache_enabled
    assert is_compile_cache_enabled(icc)
    monkeypatch.setenv("VLLM_USE_MEGA_AOT_ARTIFACT", "0")
    assert not cond_pieces_cacheable()
    monkeypatch.setenv("VLLM_USE_MEGA_AOT_ARTIFACT", "1")
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "0")  # no AOT compile: no mega artifact either
    assert not cond_pieces_cacheable()


def _mega_default(monkeypatch, default: str):
    """vLLM's VLLM_USE_MEGA_AOT_ARTIFACT with this default where unset: "0" as with torch < 2.12 (the GPU image's
    vLLM 0.26 + torch 2.11), "1" as with torch >= 2.12 (the CI's vLLM 0.32 + torch 2.13); the variable unset,
    AOT and standalone compile at vLLM's defaults. monkeypatch undoes what the function writes."""
    pytest.importorskip("vllm")
    import os

    from vllm import envs

    monkeypatch.setitem(envs.environment_variables, "VLLM_USE_MEGA_AOT_ARTIFACT",
                        lambda: os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT", default) == "1")
    for name in ("VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_AOT_COMPILE", "VLLM_USE_STANDALONE_COMPILE",
                 "VLLM_DISABLE_COMPILE_CACHE"):
        monkeypatch.setenv(name, "x")  # recorded as unset, so that the delenv below and any later set are undone
        monkeypatch.delenv(name)
    return envs


def test_one_token_routes_turn_the_mega_artifact_on_where_its_default_is_off(monkeypatch):
    """Under TRIT_FUSED_NORM_QUANT=one / TRIT_CHAIN=1 with VLLM_USE_MEGA_AOT_ARTIFACT unset and vLLM's default off
    (torch < 2.12: the GPU image), the plugin sets it, so that the compile cache keeps the cond piece
    (cond_pieces_cacheable) and disable_compile_cache leaves the cache on: on an H100 (run 95) the route's second
    start read its compile back in 11.4 s instead of compiling again for 87 s. Without it the cache was off."""
    import os

    from trit.vllm.quant import cond_pieces_cacheable, keep_cond_pieces_cacheable

    envs = _mega_default(monkeypatch, "0")
    if not envs.VLLM_USE_AOT_COMPILE:
        pytest.skip("vLLM's AOT compile is off by default here (torch < 2.10): no mega artifact to turn on")
    assert not cond_pieces_cacheable()  # as on the GPU image before
    assert keep_cond_pieces_cacheable()
    assert os.environ["VLLM_USE_MEGA_AOT_ARTIFACT"] == "1" and envs.VLLM_USE_MEGA_AOT_ARTIFACT
    assert cond_pieces_cacheable()
    assert not keep_cond_pieces_cacheable()  # set once: nothing more to do
    how, env_on, icc = _disable_in(monkeypatch, "VLLM_COMPILE", env_cached=False, mega="1")
    assert how is None and not env_on and "force_disable_caches" not in icc, (how, env_on, icc)


@pytest.mark.parametrize("case", ["user_off", "user_on", "default_on", "no_aot", "no_standalone", "env_cached"])
def test_mega_artifact_left_alone(monkeypatch, case):
    """The variable is the user's where they set it (0 keeps the cache off for the route, as before); vLLM's
    default on (torch >= 2.12) needs nothing; without AOT compile or standalone compile there is no mega artifact
    to save (vLLM asserts standalone compile under it); where vLLM has cached its variables (an engine started in
    this process already) the environment cannot reach it and is left as it was."""
    import os

    from trit.vllm.quant import keep_cond_pieces_cacheable

    envs = _mega_default(monkeypatch, "1" if case == "default_on" else "0")
    if case in ("user_off", "user_on"):
        monkeypatch.setenv("VLLM_USE_MEGA_AOT_ARTIFACT", "0" if case == "user_off" else "1")
    if case == "no_aot":
        monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "0")
    if case == "no_standalone":
        monkeypatch.setenv("VLLM_USE_STANDALONE_COMPILE", "0")
    if case == "env_cached":
        real = envs.__getattr__
        monkeypatch.setattr(envs, "__getattr__", lambda name: False if name == "VLLM_USE_MEGA_AOT_ARTIFACT"
                            else real(name))
    before = os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT")
    assert not keep_cond_pieces_cacheable()
    assert os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT") == before


def test_register_turns_the_mega_artifact_on_under_a_one_token_route(monkeypatch):
    """trit.vllm.register() under TRIT_FUSED_NORM_QUANT=one sets the variable (where unset and off by default),
    beside the split-graph fix; without a one-token route it leaves vLLM's variable alone."""
    import os

    import trit.vllm
    from vllm import ModelRegistry
    from vllm.compilation import backends

    _mega_default(monkeypatch, "0")
    orig_split = backends.split_graph
    llama = ModelRegistry.models.get("LlamaForCausalLM") if hasattr(ModelRegistry, "models") else None
    try:
        for setting, expect in (("0", None), ("one", "1")):
            monkeypatch.setenv("TRIT_FUSED_NORM_QUANT", setting)
            monkeypatch.setattr(trit.vllm, "_registered", False)
            trit.vllm.register()
            assert os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT") == expect, setting
    finally:
        backends.split_graph = orig_split
        if llama is not None:
            ModelRegistry.models["LlamaForCausalLM"] = llama
