"""bench.act_quant's CPU-side pieces: the case parser, the table, and its refusal without a capable GPU."""
import pytest
import torch

from bench import act_quant as aq


def test_parse_cases():
    assert aq.parse_cases("32:4096x14336, 1:2560X6912") == [(32, 4096, 14336), (1, 2560, 6912)]
    for bad in ("32-4096x14336", "0:4096x4096", "65:4096x4096", "32:4096", "x:1x1"):
        with pytest.raises(SystemExit, match="case"):
            aq.parse_cases(bad)
    assert all(1 <= M <= 64 for M, _, _ in aq.parse_cases(aq.DEFAULT_CASES))


def test_markdown_rows():
    rows = [dict(M=32, N=4096, K=14336, exact=True, plain_us=14.0, pro_us=16.0, actq_us=11.2, act_k_us=2.5,
                 quant_us=3.4, gemv_us=9.8, actq_quant_us=3.9, actq_gemv_us=9.8),
            dict(M=1, N=2560, K=6912, exact=False, plain_us=7.0, pro_us=6.0, actq_us=7.0, act_k_us=None,
                 quant_us=None, gemv_us=4.0, actq_quant_us=2.0, actq_gemv_us=4.0)]
    md = aq.markdown({"device": "H200", "date": "d", "commit": "c"}, rows)
    assert "| 32 | 4096x14336 | 14.00 | 16.00 | 11.20 | 1.25x | 2.50 + 3.40 + 9.80 | 3.90 + 9.80 | True |" in md
    assert "| 1 | 2560x6912 | 7.00 | 6.00 | 7.00 | 1.00x | - + - + 4.00 | 2.00 + 4.00 | False |" in md
    assert "exact=True" in aq.fmt(rows[0]) and "1.25x" in aq.fmt(rows[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert aq.main(["--cases", "32:4096x14336"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_variants_parse_and_table():
    assert aq.parse_variants(["TRIT_ACT_QUANT_VECS=2", "TRIT_QUANT_CLUSTER=1, TRIT_PDL=0"]) == [
        {"TRIT_ACT_QUANT_VECS": "2"}, {"TRIT_QUANT_CLUSTER": "1", "TRIT_PDL": "0"}]
    assert aq.parse_variants([" TRIT_ACT_QUANT_VECS = 2 "]) == [{"TRIT_ACT_QUANT_VECS": "2"}]
    for bad in ("VECS=2", "TRIT_ACT_QUANT_VECS", "TRIT_X=", "TRIT_A=1,B=2", "TRIT_=1"):
        with pytest.raises(SystemExit, match="--variant"):
            aq.parse_variants([bad])
    assert aq.variant_label({"TRIT_ACT_QUANT_VECS": "2", "TRIT_PDL": "0"}) == "ACT_QUANT_VECS=2,PDL=0"
    row = dict(M=32, N=2560, K=6912, exact=True, plain_us=11.5, pro_us=15.1, actq_us=9.2, act_k_us=1.4, quant_us=3.7,
               gemv_us=6.6, actq_quant_us=3.0, actq_gemv_us=6.6,
               variants=[{"env": "ACT_QUANT_VECS=2", "actq_us": 14.4, "actq_quant_us": 8.8, "exact": True}])
    md = aq.markdown({"device": "H100", "date": "d", "commit": "c"}, [row])
    assert "| 32 | 2560x6912 | ACT_QUANT_VECS=2 | 14.40 | 0.80x | 8.80 | True |" in md
    assert "[ACT_QUANT_VECS=2] actq 14.40" in aq.fmt(row)
