"""The target interface: anything that runs a model and hands back canonical intermediates."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Optional

import torch


#: ``--target-opt dtype=...`` spellings -> torch dtype (every target that takes a dtype reads it through as_dtype)
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def as_dtype(value, target: str = "target") -> torch.dtype:
    """A torch dtype from a command-line spelling (``--target-opt dtype=bfloat16``) or a dtype; a ValueError naming
    the accepted ones otherwise."""
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"{target}: dtype {value!r}: expected one of {sorted(DTYPES)}")


class Target(ABC):
    """A path under test.  ``capture`` runs the model on fixed prompts and returns
    {canonical name (parity.names): float32 tensor (B, T, features)} in (prompt, position)
    order.  ``compute_dtype`` ("fp32" | "bf16" | "fp16") picks the tolerance column."""

    name: str = "?"
    compute_dtype: str = "fp32"
    #: True when the target reproduces the reference's arithmetic order exactly (so no int8
    #: activation-quantisation boundary flips are legitimate): it keeps the strict fp32 column
    bit_faithful: bool = False

    @abstractmethod
    def capture(self, model_dir: Path, input_ids: torch.Tensor, *, spec_path: Optional[Path] = None
                ) -> dict[str, torch.Tensor]:
        ...

    def generate(self, model_dir: Path, input_ids: torch.Tensor, max_new_tokens: int, *,
                 spec_path: Optional[Path] = None) -> torch.Tensor:
        """Greedy continuation ids (B, max_new_tokens).  Optional."""
        raise NotImplementedError(f"target {self.name!r} does not generate")

    def faithful_for(self, model_dir: Optional[Path]) -> bool:
        """bit_faithful for this model (a target may reproduce the reference's arithmetic on some models
        only)."""
        return bool(self.bit_faithful)

    def describe(self) -> str:
        return f"{self.name} ({self.compute_dtype})"
