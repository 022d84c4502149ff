"""Does a torch C++ extension built on this machine survive streaming an integer into a std::ostream?

H200 run 33 (bench/results/2026-12-02-h200-run32-33.md): on the GPU machine (torch 2.11+cu130, g++ 13.3)
`ostringstream << (int64_t)42` inside any extension segfaults, and with it every TORCH_CHECK message that
holds a number (c10::str streams them); csrc/bindings.cpp builds its messages without a stream for that
reason. This script builds a four-function extension with torch.utils.cpp_extension.load_inline and calls
each function in its own process, then prints the compiler and the C++ runtime the process maps.
Run: python ci/ext_ostream_probe.py   (needs a C++ compiler; no GPU)
"""
import subprocess
import sys
import tempfile

SRC = r'''
#include <torch/extension.h>
#include <sstream>
std::string s_int() { std::ostringstream ss; ss << (int64_t)42; return ss.str(); }
std::string s_str() { std::ostringstream ss; ss << "abc"; return ss.str(); }
void chk_int() { TORCH_CHECK(false, "value ", (int64_t)42); }
void chk_str() { TORCH_CHECK(false, std::string("value ") + std::to_string(42)); }
'''
FUNCS = ["s_int", "s_str", "chk_int", "chk_str"]
CALL = ("import torch\nfrom torch.utils import cpp_extension\n"
        "m = cpp_extension.load_inline('ostream_probe_ext', cpp_sources=[{src!r}], functions={funcs!r}, "
        "build_directory={build!r})\n"
        "try:\n    print('RESULT returned', repr(m.{fn}()))\n"
        "except Exception as e:\n    print('RESULT raised', type(e).__name__, str(e).splitlines()[0][:120])\n")


def main() -> int:
    print(subprocess.run("c++ --version | head -1", shell=True, capture_output=True, text=True).stdout.strip())
    bad = 0
    with tempfile.TemporaryDirectory() as build:
        for fn in FUNCS:
            code = CALL.format(src=SRC, funcs=FUNCS, build=build, fn=fn)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
            res = [line for line in r.stdout.splitlines() if line.startswith("RESULT")]
            if r.returncode != 0:
                bad += 1
                print(f"{fn}(): process died (rc {r.returncode}) {r.stderr.strip().splitlines()[-1:] if r.stderr else ''}")
            else:
                print(f"{fn}(): {res[0][7:] if res else r.stdout[-200:]}")
    maps = subprocess.run([sys.executable, "-c", "import torch; print(sorted({l.split()[-1] for l in open('/proc/self/maps') "
                           "if 'libstdc++' in l or 'libgcc_s' in l}))"], capture_output=True, text=True).stdout.strip()
    print("C++ runtime mapped with torch:", maps)
    print("verdict:", "integers in an ostream crash here" if bad else "no crash")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
