"""bench.gemm_probe's matching on CPU: it must recover a known permutation of columns / rows (the
probe itself needs a CUDA device and runs in the GPU job)."""
import torch

from bench.gemm_probe import match_columns, summarize


def test_match_columns_recovers_a_permutation():
    gen = torch.Generator().manual_seed(3)
    ref = torch.randint(-50, 50, (9, 12), generator=gen).float()
    perm = torch.randperm(12, generator=gen)
    got = ref[:, perm]
    assert match_columns(got, ref) == perm.tolist()
    s = summarize(match_columns(got, ref))
    assert not s["identity"] and s["n_wrong"] == sum(int(p) != i for i, p in enumerate(perm))


def test_match_columns_identity_and_missing():
    ref = torch.arange(20.0).view(4, 5)
    assert summarize(match_columns(ref.clone(), ref)) == {"identity": True, "n_wrong": 0, "first_wrong": []}
    got = ref.clone()
    got[0, 2] = -1.0  # a column that matches nothing
    m = match_columns(got, ref)
    assert m[2] == -1 and summarize(m)["first_wrong"] == [(2, -1)]
    # equal columns in ref: the column's own index is preferred
    dup = torch.ones(3, 4)
    assert match_columns(dup, dup) == [0, 1, 2, 3]
