"""Deterministic generator of ternary test checkpoints in the transformers HF-BitNet convention.

    python -m reference.make_model --preset tiny-bitnet --out models/tiny-bitnet

Weights are drawn from a seeded generator, ternarised by absmean (BitNet b1.58:
s = 1/mean|W|, T = round(W*s).clamp(-1, 1)), packed with the HF-BitNet layout and saved as
safetensors with a ``quantization_config`` (``quant_method: bitnet``) that transformers loads
with its own BitLinear.  ``linear_class: bitlinear`` stores s and divides; ``autobitlinear``
stores 1/s and multiplies.  ``--dtype bf16`` / ``fp16`` writes bf16 / fp16 float tensors (large
presets; the fp16 checkpoints some releases ship).
Presets of real model shapes (BitNet-2B, Llama-3-8B) are here too, for the GPU benchmarks.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .formats import HF_BITNET, pack
from .io import atomic_write_text

CORPUS = Path(__file__).resolve().parent.parent / "models" / "corpus.txt"


@dataclass(frozen=True)
class Preset:
    arch: str  # "bitnet" | "llama"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tie: bool
    head_dim: Optional[int] = None
    linear_class: str = "bitlinear"
    eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_pos: int = 512
    seed: int = 0
    quantized: bool = True
    tokenizer_vocab: Optional[int] = None  # train a BPE tokenizer of this size (tiny models)
    bias: bool = False  # attention_bias (and mlp_bias for Llama)


PRESETS: dict[str, Preset] = {
    # the bundled default model: 4 layers (so `-k layer3` selects something), GQA, odd sizes
    "tiny-bitnet": Preset("bitnet", 128, 344, 4, 4, 2, 512, True, tokenizer_vocab=512, seed=1),
    # oracle configs (transformers must hold them: out_features % 4 == 0)
    "oracle-bitnet-gqa": Preset("bitnet", 72, 100, 2, 3, 1, 97, True, seed=2),
    "oracle-bitnet-auto": Preset("bitnet", 64, 176, 2, 4, 4, 101, False, linear_class="autobitlinear", seed=3),
    "oracle-llama-gqa": Preset("llama", 96, 200, 2, 6, 2, 89, False, eps=1e-5, seed=4),
    "oracle-llama-auto": Preset("llama", 80, 132, 2, 5, 5, 83, True, linear_class="autobitlinear", seed=5,
                                rope_theta=500000.0,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    # shapes transformers' BitLinear cannot hold (out_features % 4 != 0); our format pads
    "oracle-llama-bias": Preset("llama", 64, 136, 2, 2, 1, 79, False, seed=9, bias=True),
    "oracle-llama-float": Preset("llama", 64, 120, 2, 4, 1, 71, True, seed=10, quantized=False),
    "oracle-bitnet-float": Preset("bitnet", 64, 100, 2, 4, 2, 73, True, seed=11, quantized=False),
    "odd-bitnet": Preset("bitnet", 70, 102, 2, 5, 1, 61, True, head_dim=14, seed=6),
    # real model shapes (GPU benchmarks; not committed)
    "bitnet-2b": Preset("bitnet", 2560, 6912, 30, 20, 5, 128256, True, eps=1e-5, rope_theta=500000.0,
                        max_pos=4096, seed=7),
    "llama-2b-twin": Preset("llama", 2560, 6912, 30, 20, 5, 128256, True, eps=1e-5, rope_theta=500000.0,
                            max_pos=4096, seed=7),
    "llama3-8b": Preset("llama", 4096, 14336, 32, 32, 8, 128256, False, eps=1e-5, rope_theta=500000.0,
                        max_pos=8192, seed=8),
}


def rope_parameters(p: Preset) -> dict:
    """config.json's ``rope_parameters`` of a preset: ``Preset.rope_theta`` and the keys of ``Preset.rope_scaling``.
    The scaling kind may be spelled ``type`` (configs written before transformers 4.45), which transformers'
    standardize_rope_params reads only where ``rope_type`` is absent: written beside this writer's
    ``rope_type: default`` it was ignored, and the model got plain RoPE (the reference and transformers agreed on
    it, so nothing said so).  A ``rope_theta`` inside rope_scaling that differs from Preset.rope_theta is refused:
    it was overwritten by the preset's (10000 unless set)."""
    rs = dict(p.rope_scaling or {})
    kind = rs.pop("type", None)
    if kind is not None:
        if rs.get("rope_type", kind) != kind:
            raise ValueError(f"Preset.rope_scaling {p.rope_scaling}: 'type' {kind!r} and 'rope_type' "
                             f"{rs['rope_type']!r} name different RoPE kinds; give one of them")
        rs["rope_type"] = kind
    theta = rs.pop("rope_theta", p.rope_theta)
    if float(theta) != p.rope_theta:
        raise ValueError(f"Preset.rope_scaling {p.rope_scaling}: rope_theta {theta} differs from Preset.rope_theta "
                         f"{p.rope_theta}; set Preset(rope_theta={theta}) instead")
    return {"rope_type": "default", "rope_theta": p.rope_theta, **rs}


def config_dict(p: Preset) -> dict:
    head_dim = p.head_dim or p.hidden // p.heads
    d = {
        "architectures": ["BitNetForCausalLM" if p.arch == "bitnet" else "LlamaForCausalLM"],
        "model_type": p.arch,
        "vocab_size": p.vocab, "hidden_size": p.hidden, "intermediate_size": p.intermediate,
        "num_hidden_layers": p.layers, "num_attention_heads": p.heads, "num_key_value_heads": p.kv_heads,
        "head_dim": head_dim,
        "hidden_act": "relu2" if p.arch == "bitnet" else "silu",
        "max_position_embeddings": p.max_pos, "rms_norm_eps": p.eps,
        "rope_parameters": rope_parameters(p),
        "tie_word_embeddings": p.tie, "attention_bias": p.bias, "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "torch_dtype": "float32", "use_cache": True,
    }
    if p.arch == "llama":
        d["mlp_bias"] = p.bias
    if p.quantized:
        d["quantization_config"] = {"quant_method": "bitnet", "linear_class": p.linear_class,
                                    "quantization_mode": "offline", "use_rms_norm": False,
                                    "modules_to_not_convert": None}
    return d


def absmean_scale(w: torch.Tensor) -> torch.Tensor:
    """BitNet b1.58's absmean ternarisation, its one reduction: s = 1 / mean|W| (0-d float32)."""
    return 1.0 / w.abs().mean().clamp(min=1e-5)


def ternary_codes(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """round(W * s) clamped to [-1, 1], int8: elementwise, so exact wherever it runs."""
    return (w * s).round().clamp(-1, 1).to(torch.int8)


def _codes_packed(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return pack(ternary_codes(w, s), HF_BITNET)


def default_workers(p: Preset) -> int:
    """Worker threads for make_state_dict: real-model presets (hidden >= 1024) pack on up to 4 threads."""
    return min(4, os.cpu_count() or 1) if p.hidden >= 1024 else 0


def make_state_dict(p: Preset, dtype: torch.dtype = torch.float32,
                    workers: Optional[int] = None) -> dict[str, torch.Tensor]:
    """The preset's state dict. The random draws run in one seeded stream, in a fixed order, on the calling
    thread, and so does each matrix's absmean reduction; with workers > 0 (default_workers: the real-model
    presets) the elementwise ternarisation and the packing, exact integer work, run on that many threads
    while the next matrix is drawn (the Llama-3-8B preset: ~180 s one after the other on the 16-core GPU
    host, half of it packing). The tensors are the same bit for bit whatever workers is."""
    from .config import ModelConfig

    cfg = ModelConfig.from_dict(config_dict(p))
    g = torch.Generator().manual_seed(p.seed)
    workers = default_workers(p) if workers is None else workers
    pool = ThreadPoolExecutor(workers) if workers > 0 else None
    pending: list = []  # (module, future of its packed weight), in draw order

    def randn(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    sd: dict[str, torch.Tensor] = {}
    sd["model.embed_tokens.weight"] = randn(p.vocab, p.hidden).to(dtype)
    for name, shape in cfg.float_params().items():
        if name.endswith("norm.weight"):
            sd[name] = (1.0 + randn(*shape, std=0.1)).to(dtype)  # not all-ones: norm-weight bugs must show
    for mod, (n, k) in cfg.linear_shapes().items():
        if mod == "lm_head":
            if not p.tie:
                sd["lm_head.weight"] = randn(n, k).to(dtype)
            continue
        w = randn(n, k, std=1.0 / k ** 0.5)
        if p.bias and (".self_attn." in mod or p.arch == "llama"):
            sd[mod + ".bias"] = randn(n, std=0.1).to(dtype)
        if not p.quantized:
            sd[mod + ".weight"] = w.to(dtype)
            continue
        s = absmean_scale(w).reshape(1)
        if pool is None:
            sd[mod + ".weight"] = _codes_packed(w, s)
        else:
            sd[mod + ".weight"] = None  # the key's place in the dict's order; filled below
            pending.append((mod, pool.submit(_codes_packed, w, s)))
            while len(pending) > 2 * workers:  # at most 2 x workers float matrices alive
                m0, f0 = pending.pop(0)
                sd[m0 + ".weight"] = f0.result()
        sd[mod + ".weight_scale"] = (s if p.linear_class == "bitlinear" else 1.0 / s).to(dtype)
    if pool is not None:
        for m0, f0 in pending:
            sd[m0 + ".weight"] = f0.result()
        pool.shutdown()
    return sd


def train_tokenizer(vocab: int, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS.read_text()], trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    atomic_write_text(out / "tokenizer_config.json", json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "model_max_length": 512, "add_bos_token": False}, indent=1))


#: dtypes write_model stores the float tensors in -> config.json's torch_dtype (float16: the checkpoints of fp16
#: releases, norms / embeddings / scales in fp16)
TORCH_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
CLI_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def write_model(preset: str | Preset, out: str | Path, *, dtype: torch.dtype = torch.float32,
                force: bool = False) -> Path:
    from safetensors.torch import save_file

    p = PRESETS[preset] if isinstance(preset, str) else preset
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"write_model: dtype {dtype} is not one of {list(TORCH_DTYPES)} (the float tensors' dtype, "
                         f"config.json's torch_dtype)")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty; pass force=True / --force to replace it")
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    cfg = config_dict(p)
    cfg["torch_dtype"] = TORCH_DTYPES[dtype]
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    sd = make_state_dict(p, dtype)
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if p.tokenizer_vocab:
        train_tokenizer(p.tokenizer_vocab, tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def to_online(model_dir: str | Path, seed: int = 0) -> Path:
    """Turn a written ``linear_class: autobitlinear`` model into transformers' online mode in place
    (``quantization_mode: online``, as microsoft/bitnet-b1.58-2B-4T-bf16 ships): every packed linear
    becomes a float latent weight (Gaussian, a random spread per module, so each module gets its own
    mean |W| multiplier) and its weight_scale is dropped."""
    from safetensors.torch import load_file, save_file

    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text())
    q = cfg.get("quantization_config") or {}
    if q.get("linear_class") != "autobitlinear":
        raise ValueError(f"{d}: online mode needs linear_class 'autobitlinear', config.json has {q.get('linear_class')!r}")
    q["quantization_mode"] = "online"
    from .config import ModelConfig

    shapes = ModelConfig.from_dict(cfg).linear_shapes()
    sd = load_file(str(d / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for key in sorted(k for k in sd if k.endswith(".weight_scale")):
        del sd[key]
        w = key[: -len("_scale")]
        sd[w] = torch.randn(*shapes[w[: -len(".weight")]], generator=g) * (0.01 + 0.05 * torch.rand(1, generator=g))
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_text(d / "config.json", json.dumps(cfg, indent=1))
    return d


def to_rms_norm(model_dir: str | Path, seed: int = 0, eps: float = 1e-6) -> Path:
    """Turn a written ``quant_method: bitnet`` model into transformers' ``use_rms_norm`` variant in place:
    ``use_rms_norm: true`` and ``rms_norm_eps`` in quantization_config, and every converted linear (a
    BitLinear / AutoBitLinear: not in modules_to_not_convert, lm_head only when it is packed) gets its own
    input RMSNorm weight ``<module>.rms_norm.weight`` (float [in_features], 1 + 0.5 * N(0, 1) drawn per module,
    so modules that share an input - q / k / v, gate / up - see different inputs), in the dtype of the model's
    other norms."""
    from safetensors.torch import load_file, save_file

    from .config import ModelConfig
    from .spec import not_converted

    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text())
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") != "bitnet":
        raise ValueError(f"{d}: use_rms_norm is a quant_method 'bitnet' option, config.json has {q.get('quant_method')!r}")
    q["use_rms_norm"], q["rms_norm_eps"] = True, float(eps)
    shapes = ModelConfig.from_dict(cfg).linear_shapes()
    sd = load_file(str(d / "model.safetensors"))
    dtype = sd["model.norm.weight"].dtype
    skip = not_converted(q.get("modules_to_not_convert"))
    g = torch.Generator().manual_seed(seed)
    for mod in sorted(shapes):
        if mod == "lm_head" and not (f"{mod}.weight_scale" in sd or q.get("quantization_mode") == "online"
                                     and q.get("modules_to_not_convert") is not None and not skip(mod)):
            continue  # a float head (transformers' default skips): no BitLinear, no norm
        if skip(mod):
            continue
        sd[f"{mod}.rms_norm.weight"] = (1 + 0.5 * torch.randn(shapes[mod][1], generator=g)).to(dtype)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_text(d / "config.json", json.dumps(cfg, indent=1))
    return d


def to_onebit_llm(model_dir: str | Path, seed: int = 0, hidden_act: str = "silu") -> Path:
    """Turn a written BitNet ``linear_class: autobitlinear`` model into 1bitLLM's layout in place
    (config.ONEBIT_LLM: 1bitLLM/bitnet_b1_58-large and its siblings): float latent weights (``to_online``),
    config.json as 1bitLLM ships it (architectures BitnetForCausalLM, model_type llama, weight_bits 1,
    input_bits 8, hidden_act ``hidden_act``, no quantization_config) and the sub-norms under its names
    self_attn.inner_attn_ln / mlp.ffn_layernorm."""
    from safetensors.torch import load_file, save_file

    d = to_online(model_dir, seed)
    cfg = json.loads((d / "config.json").read_text())
    if cfg.get("model_type") != "bitnet":
        raise ValueError(f"{d}: 1bitLLM's layout is a BitNet model's, config.json has model_type {cfg.get('model_type')!r}")
    del cfg["quantization_config"]
    from .config import ONEBIT_LLM

    cfg.update(architectures=[ONEBIT_LLM], model_type="llama", weight_bits=1, input_bits=8,
               hidden_act=hidden_act)
    sd = load_file(str(d / "model.safetensors"))
    from .spec import SUB_NORM_ALIASES

    out = {}
    for k, v in sd.items():
        suf = next((a for a in SUB_NORM_ALIASES if k.endswith(a)), None)
        out[k[: -len(suf)] + SUB_NORM_ALIASES[suf] if suf else k] = v
    save_file(out, str(d / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_text(d / "config.json", json.dumps(cfg, indent=1))
    return d


def keep_float(model_dir: str | Path, preset: str | Preset, patterns: list, modules: list) -> Path:
    """Turn a written model into one with some linears kept in float, in place: config.json's
    ``quantization_config.modules_to_not_convert`` = patterns, and each of ``modules`` (HF module names) stored
    as the plain float weight (and bias) of the same preset unquantized, as transformers saves a module it did
    not convert.  The caller keeps patterns and modules consistent (transformers' should_convert_module)."""
    import dataclasses

    from safetensors.torch import load_file, save_file

    p = PRESETS[preset] if isinstance(preset, str) else preset
    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = list(patterns)
    sd = load_file(str(d / "model.safetensors"))
    fl = make_state_dict(dataclasses.replace(p, quantized=False))
    for m in modules:
        for k in [k for k in sd if k.startswith(m + ".")]:
            del sd[k]
        sd.update({k: v for k, v in fl.items() if k.startswith(m + ".")})
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_text(d / "config.json", json.dumps(cfg, indent=1))
    return d


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m reference.make_model", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp32", choices=list(CLI_DTYPES))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--unquantized", action="store_true",
                    help="the same shapes and seed with plain float linears (the bf16 baseline of a benchmark)")
    a = ap.parse_args(argv)
    import dataclasses

    preset = PRESETS[a.preset]
    if a.unquantized:
        preset = dataclasses.replace(preset, quantized=False)
    path = write_model(preset, a.out, dtype=CLI_DTYPES[a.dtype], force=a.force)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
