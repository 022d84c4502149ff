"""--target-opt dtype=... on every target that computes in a chosen dtype, and the fp16 column of int8-activation
models (an adversarial pass: the kernel target died on KeyError 'bfloat16'; the reference in fp16 failed 16 of 59
tensors of the bundled W1.58A8 model on the plain fp16 column, vLLM in fp16 19 while it passed in bf16)."""
from pathlib import Path

import pytest
import torch

from parity.run import main as run_main
from parity.targets import get_target
from parity.targets.base import as_dtype
from parity.tolerances import TABLE, column

ROOT = Path(__file__).resolve().parent.parent
MODEL, GOLDEN = ROOT / "models" / "tiny-bitnet", ROOT / "golden" / "tiny-bitnet"


def test_as_dtype_spellings():
    assert as_dtype("bfloat16") is torch.bfloat16 and as_dtype("fp16") is torch.float16
    assert as_dtype(torch.float32) is torch.float32
    for bad in ("int8", "bfloat", torch.int8, 16):
        with pytest.raises(ValueError, match=r"dtype .*: expected one of \['bf16', 'bfloat16'"):
            as_dtype(bad)


@pytest.mark.parametrize("name", ["kernel", "reference"])
def test_targets_take_dtype_strings(name):
    t = get_target(name, dtype="bfloat16")
    assert t.dtype is torch.bfloat16 and t.compute_dtype == "bf16"
    with pytest.raises(ValueError, match=f"{name} target: dtype 'int8'"):
        get_target(name, dtype="int8")


def test_fp16_column_of_a8_models():
    assert column("fp16", "int8_per_token", False) == "fp16-a8" == column("fp16", "int8_per_token", True)
    assert column("fp16", "none", False) == "fp16"
    assert TABLE["fp16-a8"]["operator"].rtol > TABLE["fp16"]["operator"].rtol


@pytest.mark.parametrize("target,dtype", [("reference", "float16"), ("kernel", "float16"), ("kernel", "bfloat16")])
def test_narrow_dtypes_pass_the_bundled_goldens(target, dtype, tmp_path, capsys):
    """The computation is right in each dtype: the run passes on that dtype's column (fp16: fp16-a8)."""
    rc = run_main(["--target", target, "--target-opt", f"dtype={dtype}", "--model", str(MODEL), "--golden",
                   str(GOLDEN), "--runs", str(tmp_path), "--no-noise"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ("fp16-a8 tiers" if dtype == "float16" else "bf16 tiers") in out and "59/59 tensors pass" in out
