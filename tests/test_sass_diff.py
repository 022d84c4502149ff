"""ci/sass_diff.py on nvdisasm-shaped text: register numbers and targets ignored, renames followed, order-only
differences told apart from changed instructions, new functions counted."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("sass_diff", ROOT / "ci" / "sass_diff.py")
sd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sd)


def fn(name, body):
    lines = [f".text._ZN47_GLOBAL__N__abc123_{name}:"]
    lines += [f"        /*{16 * i:04x}*/                   {ins} ;" for i, ins in enumerate(body)]
    return "\n".join(lines) + "\n"


def test_sass_diff(tmp_path, capsys):
    old = tmp_path / "old.sass"
    new = tmp_path / "new.sass"
    old.write_text(fn("k1Lb0EEEv", ["IADD3 R1, R2, R3, RZ", "BRA `(.L_x_1)", "EXIT"])
                   + fn("k2", ["IADD3 R1, R2, R3, RZ", "LOP3.LUT R4, R4, 0x3, RZ, 0xc0, !PT"])
                   + fn("k3", ["VIADD R1, R1, 0x100", "EXIT"]))
    new.write_text(fn("k1Lb0ELb0EEEv", ["IADD3 R7, R8, R9, RZ", "BRA `(.L_x_9)", "EXIT"])  # renamed, same code
                   + fn("k2", ["LOP3.LUT R4, R4, 0x3, RZ, 0xc0, !PT", "IADD3 R1, R2, R3, RZ"])  # reordered
                   + fn("k3", ["VIADD R1, R1, 0x200", "EXIT"])  # changed
                   + fn("k1Lb0ELb1EEEv", ["EXIT"]))  # new instance
    assert sd.main([str(old), str(new), "--rename", "Lb0EEEv=Lb0ELb0EEEv"]) == 0
    out = capsys.readouterr().out
    assert "3 old / 4 new functions: 1 the same, 1 the same instructions in another order, 1 changed, 1 new, 0 gone" in out
    assert "order only: _ZN47k2" in out
    assert "changed: _ZN47k3" in out
