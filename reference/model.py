"""Pure-PyTorch reference model: Llama family and BitNet b1.58, fp32 accumulation.

Loads the packed checkpoint through its spec (``reference.spec``); every intermediate
that the parity harness compares is handed to a ``tap(name, tensor)`` callback under its
canonical name (``parity.names``).  The same code runs in another compute dtype (bf16) for
the harness's bf16 target; the fp32 reference is ``dtype=torch.float32``.

Shapes: B = batch, T = tokens, H = heads, Hkv = kv heads, D = head_dim, C = hidden.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint, CheckpointError
from .config import ModelConfig, RopeConfig
from .spec import CheckpointSpec, DecodedLinear, decode_linear, spec_for, tied_lm_head_key

Tap = Callable[[str, torch.Tensor], None]

REFERENCE_VERSION = "reference-1"  # bump when the reference's numerics change (goldens go stale)


def _no_tap(name: str, t: torch.Tensor) -> None:
    pass


def act_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BitNet per-token absmax int8 quantisation, in fp32 (transformers' BitLinear.activation_quant).
    Returns (xq as float with integer values in [-128, 127], xs = 127 / absmax)."""
    x = x.float()
    xs = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return (x * xs).round().clamp(-128, 127), xs



def mlp_act(name: str, g: torch.Tensor) -> torch.Tensor:
    """transformers' ACT2FN[name] on the gate (reference.config.MLP_ACTS)."""
    if name == "relu2":
        return torch.relu(g).square()
    if name == "silu":
        return F.silu(g)
    if name in ("gelu", "gelu_pytorch_tanh"):
        return F.gelu(g, approximate="tanh" if name == "gelu_pytorch_tanh" else "none")
    raise ValueError(f"hidden_act {name!r} is not one of reference.config.MLP_ACTS")

class Linear:
    """y = x @ (values * mult)^T (+ bias), optionally with int8 activation quantisation.

    The order of operations follows the checkpoint's defining implementation (transformers'
    BitLinear: ``F.linear(xq, T) / (xs * s)`` for a divided scale; AutoBitLinear:
    ``F.linear(xq / xs, T) * s`` for a multiplied one), because with int8 activation
    quantisation a 1-ulp difference upstream moves a rounding boundary downstream."""

    def __init__(self, d: DecodedLinear, act_quant: bool, dtype: torch.dtype):
        self.act_quant = act_quant
        self.dtype = dtype
        self.per_row = d.mult.shape[-1] == 1  # tensor/channel scale: apply after the matmul
        self.div = None
        if self.per_row:
            self.w = d.values.to(dtype)  # (N, K) integers, exact in bf16
            self.mult = d.mult.reshape(1, -1).to(torch.float32)  # (1, N) or (1, 1)
            if d.div is not None:
                self.div = d.div.reshape(1, -1).to(torch.float32)
        else:
            self.w = d.effective().to(dtype)  # group scales: fold into the matrix
            self.mult = None
        self.bias = d.bias

    @property
    def out_features(self) -> int:
        return self.w.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        if self.act_quant:
            xq, xs = act_quant_int8(x)
            if self.div is not None:
                y = F.linear(xq.to(self.dtype), self.w).float() / (xs * self.div)
            elif self.mult is not None:
                y = F.linear((xq / xs).to(self.dtype), self.w).float() * self.mult
            else:
                y = F.linear((xq / xs).to(self.dtype), self.w).float()
        else:
            return self.finish(F.linear(x.to(self.dtype), self.w).float())
        if self.bias is not None:
            y = y + self.bias
        return y.to(self.dtype)

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        """The per-tensor / per-channel scale (divided or multiplied) and the bias on an fp32 product of the
        unscaled activations (x, or dequantised int8 x) with the stored values."""
        if self.div is not None:
            y = y / self.div
        elif self.mult is not None:
            y = y * self.mult
        if self.bias is not None:
            y = y + self.bias
        return y.to(self.dtype)


class NormedLinear:
    """A linear with an RMSNorm of its input inside it (spec ``InputNorm``: transformers' BitLinear /
    AutoBitLinear with ``use_rms_norm``): y = linear(rms_norm(x, weight, eps)), the norm before the activation
    quantization, computed as every RMSNorm of the reference (fp32, cast back to the model dtype)."""

    def __init__(self, weight: torch.Tensor, eps: float, inner):
        self.weight, self.eps, self.inner = weight, eps, inner

    @property
    def out_features(self) -> int:
        return self.inner.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(rms_norm(x, self.weight, self.eps))


def _to(d: DecodedLinear, device: torch.device) -> DecodedLinear:
    if device.type == "cpu":
        return d
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return DecodedLinear(d.values.to(device), d.mult.to(device), mv(d.bias), mv(d.div))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, cast back (as transformers does)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * y).to(x.dtype)


def rope_inv_freq(head_dim: int, rope: RopeConfig, seq_len: Optional[int] = None) -> torch.Tensor:
    """Inverse frequencies (D/2,) as transformers' ROPE_INIT_FUNCTIONS compute them.  ``seq_len``
    (the number of positions of the forward pass) matters only to "dynamic" NTK scaling, which
    rescales the base once a sequence is longer than max_position_embeddings."""
    # float32 arithmetic, as transformers and vLLM compute it: 1-ulp differences in RoPE flip
    # int8 activation-quantisation boundaries downstream
    base = rope.theta
    if rope.kind == "dynamic" and seq_len is not None and seq_len > rope.max_position_embeddings:
        # transformers' dynamic_frequency_update: seq_len = max(position_ids) + 1, as a tensor
        mp = rope.max_position_embeddings
        sl = torch.maximum(torch.tensor(seq_len), torch.tensor(mp))
        base = base * ((rope.factor * sl / mp) - (rope.factor - 1)) ** (head_dim / (head_dim - 2))
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "yarn":
        # transformers' _compute_yarn_parameters: interpolated (/ factor) frequencies below the correction range,
        # extrapolated (unchanged) above it, a linear ramp between; cos / sin get rope.attention_factor (forward)
        def corr_dim(rot):
            return head_dim * math.log(rope.original_max_position_embeddings / (rot * 2 * math.pi)) / (2 * math.log(base))
        low, high = corr_dim(rope.beta_fast), corr_dim(rope.beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extra = 1 - ramp
        pos_freqs = base ** (torch.arange(0, head_dim, 2).to(dtype=torch.float) / head_dim)
        inv = (1.0 / (rope.factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    elif rope.kind == "linear":
        inv = inv / rope.factor
    elif rope.kind == "llama3":
        low_wl = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wl = rope.original_max_position_embeddings / rope.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (rope.original_max_position_embeddings / wl - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        scaled = torch.where(wl > low_wl, inv / rope.factor, inv)
        mid = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        inv = torch.where(is_mid, mid, scaled)
    return inv


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@dataclass
class Overrides:
    """Deliberate deviations, used by fault-injection tests and alternative targets.

    norm_eps: {norm canonical name (e.g. "layer2.post_attn_norm"): eps}.
    linear_hook: called as hook(module_name, DecodedLinear) -> DecodedLinear after decode.
    spec_hook: called as hook(module_name, LinearEntry) -> LinearEntry before decode.
    """

    norm_eps: dict = field(default_factory=dict)
    linear_hook: Optional[Callable] = None
    spec_hook: Optional[Callable] = None
    decoder: Optional[Callable] = None  # (ckpt, entry, name) -> DecodedLinear; default decode_linear
    linear_factory: Optional[Callable] = None  # (DecodedLinear, act_quant, dtype, name) -> callable x -> y
    drop_residual: set = field(default_factory=set)  # {(layer, "attn" | "mlp")}: h = branch, not h + branch


class ReferenceModel:
    def _check_overrides(self) -> None:
        """Names an override aims at that this model does not have (a planted fault that would plant nothing)."""
        cfg, ov = self.cfg, self.ov
        bad = []
        mods = set(self.spec.linears)  # the hooks see only these: a tied / float head or a float linear is never hooked
        for hook in (ov.spec_hook, ov.linear_hook):
            aimed = getattr(hook, "modules", ())
            if isinstance(aimed, (tuple, list, set, frozenset)):  # (an nn.Module hook's .modules is its method)
                bad += [f"module {m!r} (not a quantised linear of this checkpoint)" for m in aimed if m not in mods]
        subs = ("attn.sub_norm", "mlp.sub_norm") if cfg.arch == "bitnet" else ()  # the names forward() gives _norm
        norms = {f"layer{L}.{n}" for L in range(cfg.num_layers) for n in ("input_norm", "post_attn_norm") + subs}
        norms.add("final_norm")
        bad += [f"norm {n!r}" for n in ov.norm_eps if n not in norms]
        bad += [f"residual {r!r}" for r in ov.drop_residual
                if not (isinstance(r, tuple) and len(r) == 2 and r[1] in ("attn", "mlp")
                        and isinstance(r[0], int) and 0 <= r[0] < cfg.num_layers)]
        if bad:
            raise ValueError(f"overrides aim at what this model ({cfg.arch}, {cfg.num_layers} layers) does not have: "
                             f"{', '.join(bad)}; modules are HF names (model.layers.3.self_attn.v_proj), norms "
                             f"canonical names ({', '.join(sorted(norms)[:3])}, ...), residuals (layer, 'attn'|'mlp')")

    def __init__(self, cfg: ModelConfig, spec: CheckpointSpec, ckpt: Checkpoint, *,
                 dtype: torch.dtype = torch.float32, overrides: Optional[Overrides] = None,
                 validate: bool = True, device: str | torch.device = "cpu"):
        self.cfg, self.spec, self.dtype = cfg, spec, dtype
        self.device = torch.device(device)
        self.ov = overrides or Overrides()
        if validate:
            spec.validate(cfg, ckpt)
        self._check_overrides()
        act_quant = spec.activation_quant == "int8_per_token"
        decoder = self.ov.decoder or decode_linear

        def lin(mod: str) -> Linear:
            entry = spec.linears.get(mod)
            if entry is None:  # unquantised linear kept as float in the checkpoint
                w = param(mod + ".weight")
                b = spec.tensors.get(mod + ".bias")
                d = DecodedLinear(w, torch.ones(1, 1), param_key(b, f"bias of {mod}") if b else None)
                return Linear(_to(d, self.device), False, dtype)
            if self.ov.spec_hook:
                entry = self.ov.spec_hook(mod, entry)
            d = decoder(ckpt, entry, mod)
            if self.ov.linear_hook:
                d = self.ov.linear_hook(mod, d)
            inner = (self.ov.linear_factory(d, act_quant, dtype, mod) if self.ov.linear_factory
                     else Linear(_to(d, self.device), act_quant, dtype))
            if entry.input_norm is not None:  # transformers' use_rms_norm: the BitLinear's own RMSNorm first
                return NormedLinear(param_key(entry.input_norm.key, f"{mod} input RMSNorm"), entry.input_norm.eps,
                                    inner)
            return inner

        def param_key(key: str, what: str) -> torch.Tensor:
            t = ckpt.get(key).float()
            if not bool(torch.isfinite(t).all()):  # a NaN embedding row / norm weight poisons every output
                bad = int((~torch.isfinite(t)).sum())
                raise CheckpointError(f"{ckpt.info(key).file}: tensor {key!r} ({what}) has {bad} NaN/Inf values, "
                                      f"expected finite floats")
            return t.to(self.device)

        def param(name: str) -> torch.Tensor:
            return param_key(spec.tensors[name], name)

        self.embed = param("model.embed_tokens.weight")  # (V, C)
        self.layers = []
        for L in range(cfg.num_layers):
            p = f"model.layers.{L}"
            layer = {n: lin(f"{p}.{n}") for n in (
                "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
            layer["input_norm"] = param(f"{p}.input_layernorm.weight")
            layer["post_attn_norm"] = param(f"{p}.post_attention_layernorm.weight")
            if cfg.arch == "bitnet":
                layer["attn_sub_norm"] = param(f"{p}.self_attn.attn_sub_norm.weight")
                layer["ffn_sub_norm"] = param(f"{p}.mlp.ffn_sub_norm.weight")
            self.layers.append(layer)
        self.final_norm = param("model.norm.weight")
        head = tied_lm_head_key(cfg, spec, ckpt)
        if "lm_head" in spec.linears:  # a ternary head (stored although tied: untied, see tied_lm_head_key)
            self.lm_head = None
            self.lm_head_q = lin("lm_head")
        elif cfg.tie_word_embeddings and head is None:
            self.lm_head = self.embed
        elif cfg.tie_word_embeddings:
            # tied in config.json, yet an lm_head is stored: transformers and vLLM tie only when it equals the
            # input embedding, else they use it (an untied head)
            w = ckpt.get(head).float().to(self.device)
            if not bool(torch.isfinite(w).all()):
                raise CheckpointError(f"{ckpt.info(head).file}: tensor {head!r} (lm_head.weight) has NaN/Inf values, "
                                      f"expected finite floats")
            self.lm_head = self.embed if torch.equal(w, self.embed) else w
        else:
            self.lm_head = param("lm_head.weight")
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope)

    @classmethod
    def from_dir(cls, model_dir, *, spec_path=None, **kw) -> "ReferenceModel":
        cfg = ModelConfig.load(model_dir)
        spec = spec_for(model_dir, cfg, spec_path)
        return cls(cfg, spec, Checkpoint(model_dir), **kw)

    def _eps(self, name: str) -> float:
        return self.ov.norm_eps.get(name, self.cfg.rms_norm_eps)

    def _norm(self, name: str, x: torch.Tensor, w: torch.Tensor, tap: Tap) -> torch.Tensor:
        y = rms_norm(x, w, self._eps(name))
        tap(name, y)
        return y

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, tap: Tap = _no_tap) -> torch.Tensor:
        """input_ids (B, T) -> logits (B, T, V) fp32.  Positions are 0..T-1 (no padding)."""
        cfg, dt = self.cfg, self.dtype
        B, T = input_ids.shape
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        dev = self.device
        input_ids = input_ids.to(dev)
        pos = torch.arange(T, dtype=torch.float32, device=dev)
        inv_freq = rope_inv_freq(D, cfg.rope, seq_len=T) if cfg.rope.kind == "dynamic" else self.inv_freq
        freqs = pos[:, None] * inv_freq.to(dev)[None, :]  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()  # (T, D)
        if cfg.rope.attention_factor != 1.0:  # yarn: transformers scales cos / sin in fp32 before the cast
            cos, sin = cos * cfg.rope.attention_factor, sin * cfg.rope.attention_factor
        cos, sin = cos.to(dt), sin.to(dt)
        causal = torch.full((T, T), float("-inf"), device=dev).triu(1)

        h = self.embed[input_ids].to(dt)  # (B, T, C)
        tap("embed", h)
        for L, layer in enumerate(self.layers):
            n = f"layer{L}"
            x = self._norm(f"{n}.input_norm", h, layer["input_norm"], tap)
            q = layer["self_attn.q_proj"](x)  # (B, T, H*D)
            k = layer["self_attn.k_proj"](x)  # (B, T, Hkv*D)
            v = layer["self_attn.v_proj"](x)
            tap(f"{n}.attn.q_proj", q)
            tap(f"{n}.attn.k_proj", k)
            tap(f"{n}.attn.v_proj", v)
            q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
            k = k.view(B, T, Hkv, D).transpose(1, 2)
            v = v.view(B, T, Hkv, D).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            rep = H // Hkv
            k = k.repeat_interleave(rep, dim=1)  # (B, H, T, D)
            v = v.repeat_interleave(rep, dim=1)
            scores = (q.float() @ k.float().transpose(-1, -2)) * D ** -0.5 + causal  # (B, H, T, T)
            probs = torch.softmax(scores, dim=-1).to(dt)
            a = (probs @ v).transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)
            tap(f"{n}.attn.attn_out", a)
            if cfg.arch == "bitnet":
                a = self._norm(f"{n}.attn.sub_norm", a, layer["attn_sub_norm"], tap)
            o = layer["self_attn.o_proj"](a)
            tap(f"{n}.attn.o_proj", o)
            h = o if (L, "attn") in self.ov.drop_residual else h + o
            x = self._norm(f"{n}.post_attn_norm", h, layer["post_attn_norm"], tap)
            g = layer["mlp.gate_proj"](x)
            u = layer["mlp.up_proj"](x)
            tap(f"{n}.mlp.gate_proj", g)
            tap(f"{n}.mlp.up_proj", u)
            act = mlp_act(cfg.hidden_act, g) * u
            tap(f"{n}.mlp.act", act)
            if cfg.arch == "bitnet":
                act = self._norm(f"{n}.mlp.sub_norm", act, layer["ffn_sub_norm"], tap)
            d = layer["mlp.down_proj"](act)
            tap(f"{n}.mlp.down_proj", d)
            h = d if (L, "mlp") in self.ov.drop_residual else h + d
            tap(f"{n}.output", h)
        x = self._norm("final_norm", h, self.final_norm, tap)
        if self.lm_head is not None:
            logits = x.float() @ self.lm_head.float().t()
        else:
            logits = self.lm_head_q(x).float()
        tap("logits", logits)
        return logits

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation (full recompute per step; the reference favours clarity)."""
        ids = input_ids.to(self.device)
        for _ in range(max_new_tokens):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
        return ids[:, input_ids.shape[1]:].cpu()
