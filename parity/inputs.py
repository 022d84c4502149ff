"""The fixed parity inputs: 4 prompts x 64 tokens.

Prompts are tokenized with the model's own tokenizer.json (``tokenizers``, no network) and
cut to 64 tokens; a model without a tokenizer gets seeded random ids instead.  The ids are
stored with the goldens, so a later run compares on exactly the same tokens.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

PROMPTS = [
    "The parity harness compares every layer of the serving path with a reference model. When the "
    "error of one operator jumps, the harness names the layer and the operator, prints the worst "
    "element and suggests what kind of bug would produce that pattern of differences.",
    "def unpack_ternary(packed, out_dim, in_dim):\n    \"\"\"Return a new tensor with the values in "
    "{-1, 0, +1}.\"\"\"\n    out = torch.empty(out_dim, in_dim, dtype=torch.int8)\n    for i in range(4):\n"
    "        code = (packed >> (2 * i)) & 3\n        out[:, i::4] = code - 1\n    return out\n",
    "Return a list of the words in the string, using sep as the delimiter string. If maxsplit is given, "
    "at most maxsplit splits are done. If sep is not specified or is None, any whitespace string is a "
    "separator and empty strings are removed from the result.",
    "Weights are stored as two-bit codes, four to a byte, with one scale for each output channel. The "
    "kernel reads sixteen bytes at a time, decodes the codes without branches and accumulates in fp32 "
    "before it multiplies by the scale and writes the output.",
]
NUM_PROMPTS = 4
SEQ_LEN = 64


def tokenizer_path(model_dir) -> Path | None:
    p = Path(model_dir) / "tokenizer.json"
    return p if p.exists() else None


def fixed_inputs(model_dir, vocab_size: int, seq_len: int = SEQ_LEN) -> tuple[torch.Tensor, dict]:
    """(input_ids (4, seq_len) int64, description for the manifest)."""
    tp = tokenizer_path(model_dir)
    if tp is not None:
        from reference.decode import read_tokenizer

        tok = read_tokenizer(tp, "fix or remove it (without a tokenizer.json the parity inputs are seeded random ids)")
        rows = []
        for i, text in enumerate(PROMPTS):
            ids = tok.encode(text).ids
            # a large-vocabulary tokenizer packs a prompt into fewer tokens: continue with the
            # following prompts' text (deterministic) until the row is full
            j = i + 1
            while len(ids) < seq_len and j < i + 4 * len(PROMPTS):
                ids += tok.encode(" " + PROMPTS[j % len(PROMPTS)]).ids
                j += 1
            if len(ids) < seq_len:
                raise ValueError(f"{tp}: prompt {i} yields only {len(ids)} tokens, the parity inputs need {seq_len}")
            rows.append(ids[:seq_len])
        ids = torch.tensor(rows, dtype=torch.int64)
        desc = {"source": "tokenizer", "tokenizer_sha256": hashlib.sha256(tp.read_bytes()).hexdigest(),
                "prompts": PROMPTS}
    else:
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(3, vocab_size, (NUM_PROMPTS, seq_len), generator=g)
        desc = {"source": "random", "seed": 1234}
    if int(ids.max()) >= vocab_size:
        raise ValueError(f"token id {int(ids.max())} >= vocab_size {vocab_size}: tokenizer and model disagree")
    desc["shape"] = list(ids.shape)
    return ids, desc
