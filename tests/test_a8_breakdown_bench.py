"""bench.a8_breakdown's CPU side: the kernel split of a CUPTI trace, the case parser, the table."""
import pytest

from bench import a8_breakdown as b


def _ev(name, dur, grid=None):
    return {"name": name, "dur": dur, "cat": "kernel", "args": {"grid": grid, "block": [256, 1, 1]}}


def test_split_by_kind_and_route():
    ev = [_ev("void quant_rows_perm_kernel<__nv_bfloat16, true>(...)", 3.0), _ev("void a8_gemm_kernel<...>", 10.0,
          [54, 2, 2]), _ev("void quant_rows_perm_kernel<__nv_bfloat16, true>(...)", 5.0),
          _ev("void a8_gemm_kernel<...>", 12.0, [54, 2, 2]), _ev("Memset (Device)", 1.0)]
    r = b.kernel_split(ev)
    assert (r["quant_us"], r["gemm_us"], r["other_us"], r["other_per_op"]) == (4.0, 11.0, 1.0, 0.5)
    assert r["kernel"] == "a8_gemm_kernel" and r["grid"] == [54, 2, 2] and r["other_kernels"] == ["Memset (Device)"]
    # the v4 kernel's route (M = 128 on the smallest layers): not mistaken for a missing GEMM kernel
    v4 = b.kernel_split([_ev("void (anonymous namespace)::a8_kernel<__nv_bfloat16, 8, 2>(...)", 11.6, [20, 2, 1]),
                         _ev("void (anonymous namespace)::quant_rows_kernel<__nv_bfloat16>(...)", 4.1)])
    assert v4["kernel"] == "a8_kernel" and v4["gemm_us"] == 11.6 and v4["quant_us"] == 4.1


def test_no_main_kernel_is_named():
    with pytest.raises(RuntimeError, match=r"none of .* in the profile.*'quant_rows_kernel"):
        b.kernel_split([_ev("quant_rows_kernel<float>", 1.0)])


def test_cases_and_table():
    assert b.parse_cases("128:640x2560, 96:4096x4096") == [(128, 640, 2560), (96, 4096, 4096)]
    for bad in ("16:640x2560", "300:640x2560", "128x640"):
        with pytest.raises(SystemExit):
            b.parse_cases(bad)
    r = {**b.kernel_split([_ev("a8_gemm_kernel", 10.0, [1, 2, 4]), _ev("quant_rows_perm_kernel", 2.0)]),
         "M": 128, "N": 640, "K": 2560, "env": {"TRIT_A8_GEMM_KS": 4}, "op_us": 13.0, "rest_us": 1.0,
         "equal_default": True}
    md = b.markdown({"device": "X", "date": "d", "commit": "c", "command": "cmd"}, [r])
    assert "| 128 | 640x2560 | TRIT_A8_GEMM_KS=4 | a8_gemm_kernel | [1, 2, 4] | 2.0 | 10.00 |" in md
    assert "TRIT_A8_GEMM_KS=4" in b.fmt(r)


def test_env_variants():
    assert b.parse_env(["TRIT_A8_GEMM_QCL=8", "TRIT_A8_GEMM=1, TRIT_A8_GEMM_QCL=1"]) == [
        {"TRIT_A8_GEMM_QCL": "8"}, {"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_QCL": "1"}]
    for bad in ("TRIT_A8_GEMM_QCL", "A8_GEMM_QCL=8", "TRIT_A8_GEMM_QCL=", "TRIT_A8_GEMM=1,,"):
        with pytest.raises(SystemExit, match="--env"):
            b.parse_env([bad])
