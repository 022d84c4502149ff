"""Per-tensor parity tests, one per canonical name of the golden set (ids = names).

`pytest parity/ -k layer3` runs layer 3's tensors; `--target` picks the path under test."""
import pytest


@pytest.mark.parity
def test_parity(parity_name, parity_result, request):
    if parity_name == "golden-missing":
        from .pytest_plugin import golden_problem

        pytest.fail(golden_problem(request.config) or "no golden set", pytrace=False)
    cmp = parity_result.comparison
    if parity_name == "top10":
        tk = cmp.topk
        assert tk is not None, "the target captured no logits"
        if not tk.passed:
            pytest.fail(f"top-10 disagreement at {tk.unexplained}/{tk.positions} positions not explained by "
                        f"near-ties: {tk.worst} (top-1 agreement {tk.top1_agree:.1%})", pytrace=False)
        return
    r = cmp.by_name()[parity_name]
    msg = r.line() + "".join(f"\n  hint: {h}" for h in r.hints)
    if not r.passed:
        fd = cmp.first_divergence
        if fd is not None and fd.name != r.name:
            msg += f"\n  (first divergence in this run: {fd.name})"
        pytest.fail(msg, pytrace=False)
    if r.jump and request.config.getoption("--jump-gate"):
        pytest.fail(msg, pytrace=False)
