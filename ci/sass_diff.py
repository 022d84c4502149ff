"""Which kernels of two builds of csrc/ternary_gemm.cu differ in their SASS (a compile-only check, no GPU).

    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DTRIT_HOST_SM90A=1 -Icsrc -cubin \\
        csrc/ternary_gemm.cu -o new.cubin            (and the same for the old tree -> old.cubin)
    nvdisasm -c old.cubin > old.sass; nvdisasm -c new.cubin > new.sass   (nvdisasm: CUDA toolkit, or PyPI's
                                                                          nvidia-cuda-nvdisasm wheel)
    python ci/sass_diff.py old.sass new.sass [--rename OLD_SUFFIX=NEW_SUFFIX ...]

Functions are matched by mangled name (the anonymous-namespace hash removed; --rename maps a name change such as
a template parameter added with its default, e.g. Lb0EEEv=Lb0ELb0EEEv). Instructions are compared with register
numbers, branch targets and internal call names removed: "same" means the same instructions in the same order up
to register allocation. ptxas does not schedule every kernel identically from one compile to the next (compile
the old tree twice to see which kernels move on their own: --noise old2.sass). A report, not a gate: it exits 0.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter


def functions(path: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur = None
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*\.text\.(\S+):", line)
            if m:
                cur = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "", m.group(1))
                out[cur] = []
                continue
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line) if cur else None
            if m:
                ins = re.sub(r"`\([^)]*\)", "T", m.group(1))  # branch / call targets, own name
                out[cur].append(re.sub(r"\bU?R\d+\b", "R", ins))
    if not out:
        raise SystemExit(f"{path}: no functions found (expected `nvdisasm -c` output)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rename", action="append", default=[], help="OLD=NEW substring of the new build's names")
    ap.add_argument("--noise", help="a second compile of the old tree: kernels that differ there are ptxas's own")
    a = ap.parse_args(argv)
    old, new = functions(a.old), functions(a.new)
    noise = set()
    if a.noise:
        again = functions(a.noise)
        noise = {k for k in old if again.get(k) != old[k]}
    ren = [tuple(r.split("=", 1)) for r in a.rename]
    same, order_only, changed, added = [], [], [], []
    for k, v in new.items():
        ok = k
        for o, n in ren:
            ok = ok.replace(n, o)
        if ok not in old:
            added.append(k)
        elif old[ok] == v:
            same.append(k)
        elif Counter(old[ok]) == Counter(v):
            order_only.append(ok)
        else:
            changed.append(ok)
    gone = set(old) - {k for k in new} - {k.replace(n, o) for k in new for o, n in ren}
    print(f"{len(old)} old / {len(new)} new functions: {len(same)} the same, {len(order_only)} the same "
          f"instructions in another order, {len(changed)} changed, {len(added)} new, {len(gone)} gone")
    for tag, names in (("order only", order_only), ("changed", changed)):
        for k in names:
            print(f"  {tag}{' (also between two compiles of the old tree)' if k in noise else ''}: {k[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
