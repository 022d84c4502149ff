"""bench.vllm_parity's CPU-side pieces: the per-step route evidence (step_counts) and the generation check."""
import torch

from bench import vllm_parity as vp
from trit import ops


class _FakeGraphs:
    """A stand-in for the vLLM target: generate(model, ids, n) runs `per_prefill` trit ops for the prompt and
    `per_step` more for each further token, as a one-prompt generation through the plugin does."""

    def __init__(self, per_prefill: int, per_step: int):
        self.per_prefill, self.per_step = per_prefill, per_step
        N, K = 32, 64
        self.args = (torch.randn(1, K), ops.repack(torch.randint(-1, 2, (N, K), dtype=torch.int8)), torch.rand(N), N, K)

    def generate(self, model_dir, ids, n):
        assert ids.shape[0] == 1
        x, p, s, N, K = self.args
        for _ in range(self.per_prefill + self.per_step * (n - 1)):
            torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
        return torch.zeros(1, n, dtype=torch.long)


def test_step_counts_are_per_decode_step():
    got = vp.step_counts(_FakeGraphs(per_prefill=7, per_step=3), "m", torch.zeros(1, 5, dtype=torch.long), tokens=4)
    assert got.get("trit::ternary_mm_a8") == 3.0, got
    assert all(v > 0 for v in got.values())


def test_generation_check_reuses_given_reference_continuations():
    class Ref:
        calls = 0

        def generate(self, ids, n):
            Ref.calls += 1
            return torch.ones(ids.shape[0], n, dtype=torch.long)

    ids = torch.zeros(2, 3, dtype=torch.long)
    same = torch.ones(2, 4, dtype=torch.long)
    res = vp.generation_check(Ref(), ids, same, 0.5, ref_new=torch.ones(2, 4, dtype=torch.long))
    assert res["passed"] and Ref.calls == 0 and all(r["identical"] for r in res["rows"])
    res = vp.generation_check(Ref(), ids, same, 0.5)
    assert res["passed"] and Ref.calls == 1


def test_step_counts_says_when_it_saw_nothing():
    got = vp.step_counts(_FakeGraphs(per_prefill=2, per_step=0), "m", torch.zeros(1, 5, dtype=torch.long), tokens=3)
    assert list(got) == ["error"] and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in got["error"]
