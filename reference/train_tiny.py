"""Quantisation-aware training of a tiny BitNet b1.58 model on ``models/corpus.txt`` (CPU).

    nice python -m reference.train_tiny --out models/tiny-trained [--steps 600]

Why: a format inspector can only tell a +-1 swap, a bit order or a lane layout apart by the
model's loss on real text, which needs a model that has *learned* something.  Random
checkpoints (``reference.make_model``) score the same under every decode.

Architecture = ``reference.model`` (BitNet: sub-norms, relu^2, tied embeddings, GQA, RoPE).
Every linear is BitLinear with a straight-through estimator (BitNet b1.58):

    weights:      s = 1 / mean|W|,  T = round(W * s).clamp(-1, 1),  W_q = T / s   (per tensor)
    activations:  xs = 127 / absmax(x) per token, x_q = round(x * xs).clamp(-128, 127) / xs

The result is written in the transformers HF-BitNet ``bitlinear`` convention (T packed with
``reference.formats.HF_BITNET``, ``weight_scale`` = s, divided), so ``ReferenceModel.from_dir``
computes exactly the function that was trained.  Deterministic: fixed seeds, a fixed thread
count, a seeded batch order.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .formats import HF_BITNET, pack
from .io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "models" / "corpus.txt"
TOKENIZER_DIR = ROOT / "models" / "tiny-bitnet"

CONFIG = {
    "architectures": ["BitNetForCausalLM"], "model_type": "bitnet",
    "vocab_size": 512, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "hidden_act": "relu2",
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": True, "attention_bias": False, "initializer_range": 0.02,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32", "use_cache": True,
    "quantization_config": {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline",
                            "use_rms_norm": False, "modules_to_not_convert": None},
}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def tokenize_corpus(tokenizer_dir: Path = TOKENIZER_DIR, corpus: Path = CORPUS) -> torch.Tensor:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return torch.tensor(tok.encode(corpus.read_text()).ids, dtype=torch.long)


def split_tokens(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """95% train / last 5% held out (the held-out tail is what the inspector scores on)."""
    cut = int(len(ids) * 0.95)
    return ids[:cut], ids[cut:]


# ---------------------------------------------------------------------------------------
# quantisers with straight-through gradients


def ternary_ste(w: torch.Tensor) -> torch.Tensor:
    s = 1.0 / w.abs().mean().clamp(min=1e-5)
    wq = (w * s).round().clamp(-1, 1) / s
    return w + (wq - w).detach()


def act_quant_ste(x: torch.Tensor) -> torch.Tensor:
    xs = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    xq = (x * xs).round().clamp(-128, 127) / xs
    return x + (xq - x).detach()


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class TinyBitNet(torch.nn.Module):
    def __init__(self, cfg: dict, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        C, I = cfg["hidden_size"], cfg["intermediate_size"]
        H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        shapes = {"self_attn.q_proj": (H * D, C), "self_attn.k_proj": (Hkv * D, C), "self_attn.v_proj": (Hkv * D, C),
                  "self_attn.o_proj": (C, H * D), "mlp.gate_proj": (I, C), "mlp.up_proj": (I, C),
                  "mlp.down_proj": (C, I)}
        P = torch.nn.Parameter
        self.embed = P(torch.randn(cfg["vocab_size"], C, generator=g) * 0.02)
        self.w = torch.nn.ParameterDict()
        self.norms = torch.nn.ParameterDict()
        for L in range(cfg["num_hidden_layers"]):
            for m, (n, k) in shapes.items():
                self.w[f"{L}_{m.replace('.', '_')}"] = P(torch.randn(n, k, generator=g) / math.sqrt(k))
            for nm, size in (("input_layernorm", C), ("post_attention_layernorm", C),
                             ("self_attn_attn_sub_norm", C), ("mlp_ffn_sub_norm", I)):
                self.norms[f"{L}_{nm}"] = P(torch.ones(size))
        self.final_norm = P(torch.ones(C))
        inv = 1.0 / (cfg["rope_parameters"]["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def lin(self, L: int, m: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(act_quant_ste(x), ternary_ste(self.w[f"{L}_{m.replace('.', '_')}"]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        cfg = self.cfg
        B, T = ids.shape
        H, Hkv, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
        f = torch.arange(T, dtype=torch.float32)[:, None] * self.inv_freq[None]
        emb = torch.cat((f, f), -1)
        cos, sin = emb.cos(), emb.sin()  # (T, D)

        def rope(t):
            t1, t2 = t.chunk(2, -1)
            return t * cos + torch.cat((-t2, t1), -1) * sin

        h = self.embed[ids]  # (B, T, C)
        for L in range(cfg["num_hidden_layers"]):
            x = rms_norm(h, self.norms[f"{L}_input_layernorm"], eps)
            q = self.lin(L, "self_attn.q_proj", x).view(B, T, H, D).transpose(1, 2)
            k = self.lin(L, "self_attn.k_proj", x).view(B, T, Hkv, D).transpose(1, 2)
            v = self.lin(L, "self_attn.v_proj", x).view(B, T, Hkv, D).transpose(1, 2)
            q, k = rope(q), rope(k)
            k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, H * D)
            a = rms_norm(a, self.norms[f"{L}_self_attn_attn_sub_norm"], eps)
            h = h + self.lin(L, "self_attn.o_proj", a)
            x = rms_norm(h, self.norms[f"{L}_post_attention_layernorm"], eps)
            act = torch.relu(self.lin(L, "mlp.gate_proj", x)).square() * self.lin(L, "mlp.up_proj", x)
            act = rms_norm(act, self.norms[f"{L}_mlp_ffn_sub_norm"], eps)
            h = h + self.lin(L, "mlp.down_proj", act)
        return rms_norm(h, self.final_norm, eps) @ self.embed.t()

    def export(self) -> dict[str, torch.Tensor]:
        """HF-BitNet bitlinear state dict: packed T, weight_scale = s (W = T / s)."""
        sd = {"model.embed_tokens.weight": self.embed.detach().clone(), "model.norm.weight": self.final_norm.detach().clone()}
        for L in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{L}"
            for m in LINEARS:
                w = self.w[f"{L}_{m.replace('.', '_')}"].detach()
                s = 1.0 / w.abs().mean().clamp(min=1e-5)
                t = (w * s).round().clamp(-1, 1).to(torch.int8)
                sd[f"{p}.{m}.weight"] = pack(t, HF_BITNET)
                sd[f"{p}.{m}.weight_scale"] = s.reshape(1).float()
            for nm in ("input_layernorm", "post_attention_layernorm"):
                sd[f"{p}.{nm}.weight"] = self.norms[f"{L}_{nm}"].detach().clone()
            sd[f"{p}.self_attn.attn_sub_norm.weight"] = self.norms[f"{L}_self_attn_attn_sub_norm"].detach().clone()
            sd[f"{p}.mlp.ffn_sub_norm.weight"] = self.norms[f"{L}_mlp_ffn_sub_norm"].detach().clone()
        return sd


def batches(ids: torch.Tensor, batch: int, seq: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=g)
        x = torch.stack([ids[s:s + seq + 1] for s in starts.tolist()])
        yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def eval_loss(model: TinyBitNet, ids: torch.Tensor, seq: int = 64, n: int = 16) -> float:
    x = ids[: n * (seq + 1)].view(n, seq + 1)
    logits = model(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def train(out: Path, steps: int = 500, batch: int = 24, seq: int = 96, lr: float = 4e-3, seed: int = 0,
          threads: int = 1, log_every: int = 50) -> dict:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    ids = tokenize_corpus()
    train_ids, held = split_tokens(ids)
    model = TinyBitNet(CONFIG, seed=seed)
    decay = [p for n, p in model.named_parameters() if n.startswith("w.")]
    other = [p for n, p in model.named_parameters() if not n.startswith("w.")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))))
    t0 = time.time()
    it = batches(train_ids, batch, seq, seed)
    for step in range(steps):
        x, y = next(it)
        loss = F.cross_entropy(model(x).reshape(-1, CONFIG["vocab_size"]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.time() - t0:6.1f}s", flush=True)
    held_loss = eval_loss(model, held)
    print(f"held-out loss {held_loss:.4f}")
    write(model, out, {"steps": steps, "batch": batch, "seq": seq, "lr": lr, "seed": seed,
                       "held_out_loss_qat": round(held_loss, 4)})
    return {"held_out_loss": held_loss}


def write(model: TinyBitNet, out: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    atomic_write_text(tmp / "config.json", json.dumps(CONFIG, indent=1))
    save_file(model.export(), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / f, tmp / f)
    atomic_write_text(tmp / "training.json", json.dumps(meta, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m reference.train_tiny", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "models" / "tiny-trained"))
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    train(Path(a.out), steps=a.steps, seed=a.seed)


if __name__ == "__main__":
    main()
