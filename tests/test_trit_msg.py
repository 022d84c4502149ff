"""csrc/trit_msg.h: the refusal messages of the CUDA ops, built without std::ostream (a number streamed inside
an extension crashed the process on the H200 machine; H200 runs 32-33). Compiled here into a small CPU
extension, so CI checks what every CUDA-side refusal prints; the GPU side is tests/test_ops_cuda.py
test_cuda_ops_refuse_bad_input_cleanly."""
import re
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

CSRC = Path(__file__).resolve().parent.parent / "csrc"

SRC = r'''
#include <torch/extension.h>
#include "trit_msg.h"
std::string fmt_all() {
  const std::vector<int64_t> sizes{7, 896};
  return trit_msg("trit::x: ", (int64_t)-12, " ", 33, " ", (size_t)5, " ", c10::IntArrayRef(sizes), " ",
                  c10::IntArrayRef(), " ", at::kBFloat16, " ", c10::Device("cpu"), " ", std::string("end"));
}
void refuse(int64_t M) { TRIT_CHECK(M <= 32, "trit::op: runs at M <= 32 only (M = ", M, ")"); }
'''


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    return cpp_extension.load_inline("trit_msg_test_ext", cpp_sources=[SRC], functions=["fmt_all", "refuse"],
                                     extra_include_paths=[str(CSRC)],
                                     build_directory=str(tmp_path_factory.mktemp("trit_msg_build")))


def test_trit_msg_formats_like_torch(ext):
    assert ext.fmt_all() == "trit::x: -12 33 5 [7, 896] [] BFloat16 cpu end"
    # torch prints sizes and dtypes the same way (what the messages looked like before)
    assert str(list(torch.empty(7, 896).shape)) == "[7, 896]"


def test_trit_check_raises_only_when_the_condition_fails(ext):
    ext.refuse(32)
    with pytest.raises(RuntimeError, match=re.escape("trit::op: runs at M <= 32 only (M = 33)")):
        ext.refuse(33)


def test_bindings_use_trit_check_only():
    """Every check in csrc/bindings.cpp goes through TRIT_CHECK (a bare TORCH_CHECK with a number in its
    message would crash on the H200 machine instead of raising)."""
    src = (CSRC / "bindings.cpp").read_text()
    bare = [i + 1 for i, line in enumerate(src.splitlines()) if re.search(r"\b(TORCH_CHECK|AT_ERROR|TORCH_INTERNAL_ASSERT)\s*\(", line)]
    assert not bare, f"csrc/bindings.cpp lines {bare}: use TRIT_CHECK (csrc/trit_msg.h)"
    assert src.count("TRIT_CHECK(") >= 40
