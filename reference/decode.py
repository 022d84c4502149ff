"""Decode a packed checkpoint into dense fp32 effective weights under standard HF names.

    python -m reference.decode DIR [--spec SPEC] --out W.safetensors

Every linear module becomes ``{module}.weight`` float32 ``(N, K)`` = values * scale (fused
tensors split back into q/k/v and gate/up), every float parameter is copied under its HF name
(``model.embed_tokens.weight``, ``model.layers.N.input_layernorm.weight``, ...), and a module's input RMSNorm
(spec ``input_norm``: transformers' use_rms_norm) as ``{module}.rms_norm.weight``.  Also home of
the loss helpers the inspector uses to score candidate decodes (``text_ids``, ``model_loss``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint, CheckpointError
from .config import ModelConfig
from .formats import FormatError
from .spec import CheckpointSpec, decode_linear, spec_for

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = ROOT / "models" / "corpus.txt"


def effective_weights(model_dir, spec: Optional[CheckpointSpec] = None, *, spec_path=None,
                      validate: bool = True) -> dict[str, torch.Tensor]:
    """HF name -> float32 tensor for every parameter of the model (one module at a time)."""
    cfg = ModelConfig.load(model_dir)
    spec = spec or spec_for(model_dir, cfg, spec_path)
    ckpt = Checkpoint(model_dir)
    if validate:
        spec.validate(cfg, ckpt)
    out: dict[str, torch.Tensor] = {}
    for mod, entry in spec.linears.items():
        d = decode_linear(ckpt, entry, mod)
        out[f"{mod}.weight"] = d.effective().contiguous()  # (N, K)
        if d.bias is not None:
            out[f"{mod}.bias"] = d.bias.contiguous()
        if entry.input_norm is not None:  # use_rms_norm: the module's own input RMSNorm, under transformers' name
            out[f"{mod}.rms_norm.weight"] = ckpt.get(entry.input_norm.key).to(torch.float32).contiguous()
    for hf, key in spec.tensors.items():
        out[hf] = ckpt.get(key).to(torch.float32).contiguous()
    return out


def read_tokenizer(path, advice: str):
    """A tokenizer.json through ``tokenizers``; a truncated or invalid file (tokenizers raises a bare Exception) is a
    CheckpointError naming it, with ``advice`` (what the caller can do instead)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: not a readable tokenizers file ({e}); {advice}") from None


def text_ids(model_dir, text: Optional[str] = None, *, n_seq: int = 2, seq_len: int = 64) -> torch.Tensor:
    """Token ids (n_seq, seq_len + 1) of a text sample, with the model directory's tokenizer.
    Default text: the held-out tail (last 5%) of models/corpus.txt."""
    d = Path(model_dir)
    tok_path = d / "tokenizer.json"
    slow = [f for f in ("tokenizer.model", "tokenizer_config.json") if (d / f).exists()]
    gguf_tok = None
    if not tok_path.exists() and not slow:
        from .checkpoint import gguf_model, gguf_source

        src = gguf_source(d)
        if src is None:
            raise CheckpointError(f"{model_dir}: no tokenizer.json, tokenizer.model or tokenizer_config.json, cannot "
                                  f"score candidates on text (pass --no-loss to rely on statistics only)")
        gguf_tok = gguf_model(src).tokenizer()  # the GGUF's own (tokenizer.ggml.*), or a CheckpointError saying why not
    if text is None:
        if not DEFAULT_TEXT.exists():
            raise CheckpointError(f"no --text given and {DEFAULT_TEXT} is missing")
        full = DEFAULT_TEXT.read_text()
        text = full[int(len(full) * 0.95):]
    if gguf_tok is not None:
        ids = gguf_tok.encode(text).ids
    elif tok_path.exists():
        ids = read_tokenizer(tok_path, "fix it, or pass --no-loss to rely on statistics only").encode(text).ids
    else:  # a sentencepiece tokenizer.model (Llama-2-style checkpoints ship no tokenizer.json): transformers reads it
        try:
            from transformers import AutoTokenizer

            ids = AutoTokenizer.from_pretrained(str(d))(text)["input_ids"]
        except Exception as e:  # noqa: BLE001 - any loader failure is the same answer for the user
            raise CheckpointError(f"{model_dir}: no tokenizer.json, and transformers could not load the tokenizer "
                                  f"from {', '.join(slow)} ({type(e).__name__}: {e}); pass --no-loss to rely on "
                                  f"statistics only") from e
    if len(ids) < seq_len + 1:
        raise CheckpointError(f"text sample has {len(ids)} tokens, at least {seq_len + 1} are needed")
    n = min(n_seq, len(ids) // (seq_len + 1))
    return torch.tensor(ids[: n * (seq_len + 1)], dtype=torch.long).view(n, seq_len + 1)


@torch.no_grad()
def model_loss(cfg: ModelConfig, spec: CheckpointSpec, ckpt: Checkpoint, ids: torch.Tensor, *,
               overrides=None) -> float:
    """Mean next-token cross entropy (nats) of the reference model under ``spec`` on ids (B, T+1)."""
    from .model import ReferenceModel

    m = ReferenceModel(cfg, spec, ckpt, validate=False, overrides=overrides)
    logits = m.forward(ids[:, :-1])  # (B, T, V)
    if int(ids.max()) >= cfg.vocab_size:
        raise CheckpointError(f"tokenizer produced id {int(ids.max())} >= vocab_size {cfg.vocab_size}")
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
    return float(loss) if torch.isfinite(loss) else float("inf")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference.decode", description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--spec", default=None, help="spec JSON (default: DIR/ternary_spec.json or config.json)")
    ap.add_argument("--out", required=True, help="output .safetensors of fp32 effective weights")
    a = ap.parse_args(argv)
    try:
        from safetensors.torch import save

        from .io import atomic_write_bytes

        w = effective_weights(a.dir, spec_path=a.spec)
        atomic_write_bytes(Path(a.out), save(w, metadata={"format": "pt", "source": str(a.dir)}))
    except (CheckpointError, FormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # never a bare traceback from the CLI
        print(f"error: unexpected {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {len(w)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
