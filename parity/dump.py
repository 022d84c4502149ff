"""Make golden sets from the fp32 reference.

    python -m parity.dump --ref [--model models/tiny-bitnet] [--out golden/tiny-bitnet] [--force] [--no-floor]

``--ref`` is the only source of goldens (the reference is the ground truth by definition);
the flag is explicit so that nobody dumps a target under test as a golden by accident.

For a model with int8 activations the command also measures the set's ``fp32-a8`` noise floor
(``noise-fp32-a8.json``, as ``python -m parity.noise --target reference --target-opt act_quant=divide``
would): the reference again with its activation quantiser rounding the other way, i.e. the int8
boundary flips alone. An independent fp32 target (kernel, vLLM) is then judged against 2x that
floor where it exceeds the static tier - small widths leave that tier within a few layers on
correct targets. ``--no-floor`` writes the goldens only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from reference.checkpoint import CheckpointError
from reference.config import ModelConfig
from reference.model import REFERENCE_VERSION, ReferenceModel
from reference.spec import spec_for

from . import names as N
from .golden import GoldenError, compute_fingerprint, write_golden
from .inputs import SEQ_LEN, fixed_inputs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "tiny-bitnet"
DEFAULT_GOLDEN = ROOT / "golden" / "tiny-bitnet"


def dump_reference(model_dir: Path, out: Path, *, spec_path=None, force: bool = False, device: str = "cpu",
                   floor: bool = False) -> Path:
    """fp32 reference forward on the fixed inputs; every canonical tensor into a golden set.
    ``device="cuda"`` runs the same fp32 code on a GPU (real-sized models). ``floor``: for an int8-activation
    model also the set's fp32-a8 noise floor (``measure_a8_floor``; the CLI's default)."""
    cfg = ModelConfig.load(model_dir)
    spec = spec_for(model_dir, cfg, spec_path)
    # a model with a short context gets inputs that fit it, one position left for the token the vllm target
    # samples after the prompt (vLLM refuses a longer prompt; RoPE past the trained positions is no test either)
    seq_len = min(SEQ_LEN, cfg.max_position_embeddings - 1)
    if seq_len < 2:
        raise ValueError(f"{model_dir}/config.json: max_position_embeddings {cfg.max_position_embeddings} leaves "
                         f"fewer than 2 input positions (the parity inputs need 2 to {SEQ_LEN} tokens)")
    input_ids, desc = fixed_inputs(model_dir, cfg.vocab_size, seq_len)
    if seq_len < SEQ_LEN:
        desc["seq_len_note"] = (f"cut from {SEQ_LEN} to {seq_len} tokens: config.json max_position_embeddings "
                                f"{cfg.max_position_embeddings}, one position left for a sampled token")
        print(f"note: {desc['seq_len_note']}", file=sys.stderr)
    model = ReferenceModel.from_dir(model_dir, spec_path=spec_path, device=device)
    captured = {}
    model.forward(input_ids, lambda n, t: captured.__setitem__(n, t.detach().float().cpu().clone()))
    order = N.canonical_names(cfg.num_layers, cfg.arch)
    path = write_golden(out, captured, order, input_ids, model_dir=model_dir, spec=spec, inputs_desc=desc,
                        reference_version=REFERENCE_VERSION, arch=cfg.arch, num_layers=cfg.num_layers,
                        force=force, compute=compute_fingerprint(device))
    if floor and spec.activation_quant == "int8_per_token":
        del model, captured  # a real-sized model: one reference in memory at a time
        measure_a8_floor(model_dir, path, spec_path=spec_path, device=device)
    return path


def measure_a8_floor(model_dir: Path, golden_dir: Path, *, spec_path=None, device: str = "cpu") -> Optional[Path]:
    """The fp32-a8 noise floor of a freshly written golden set (noise-fp32-a8.json): the reference with
    act_quant=divide. The goldens stand without it: a floor that cannot be measured (its top-10 check fails, ...)
    is said on stderr and None returned; an existing floor file is never replaced here."""
    from .noise import measure_noise

    try:
        p = measure_noise(model_dir, golden_dir, target="reference",
                          target_options={"act_quant": "divide", "device": device}, spec_path=spec_path)
    except Exception as e:  # noqa: BLE001 - the goldens are written and valid whatever failed here
        what = str(e) if isinstance(e, GoldenError) else f"{type(e).__name__}: {e}"
        print(f"note: no fp32-a8 noise floor for {golden_dir}: {what} (the goldens are written; measure one later with "
              f"`python -m parity.noise --model {model_dir} --golden {golden_dir} --target reference --target-opt "
              f"act_quant=divide`)", file=sys.stderr)
        return None
    print(f"wrote fp32-a8 noise floor {p} (the reference with its activation quantiser dividing)")
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.dump", description=__doc__.strip().split("\n")[0])
    ap.add_argument("--ref", action="store_true", required=True, help="dump the fp32 reference (required)")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--spec", type=Path, default=None, help="format spec JSON (default: from the model dir)")
    ap.add_argument("--out", type=Path, default=None, help="golden dir (default golden/<model dir name>)")
    ap.add_argument("--force", action="store_true", help="replace an existing set (kept aside as .prev-*)")
    ap.add_argument("--device", default="cpu", help="where the fp32 reference runs (cpu, cuda)")
    ap.add_argument("--no-floor", action="store_true", help="int8-activation models: skip the fp32-a8 noise floor "
                    "(noise-fp32-a8.json, a second reference forward)")
    a = ap.parse_args(argv)
    out = a.out or ROOT / "golden" / a.model.resolve().name  # resolve: `--model .` has no name
    try:
        path = dump_reference(a.model, out, spec_path=a.spec, force=a.force, device=a.device, floor=not a.no_floor)
    except (GoldenError, CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, AssertionError, RuntimeError) as e:  # a path that cannot be read or written (a missing --spec,
        # an --out under a file or a read-only directory), --device cuda where torch has no CUDA: said, not a traceback
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - anything else is an error too (exit 2), never a silent 1
        import traceback

        traceback.print_exc()
        print(f"error: the dump failed: {type(e).__name__}: {e} (traceback above); nothing was written to {out}",
              file=sys.stderr)
        return 2
    print(f"wrote golden set {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
