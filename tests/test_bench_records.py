"""Benchmark records: never written over an earlier record; the commit field says what ran."""
import json
import sys
import time

import pytest

from bench.records import commit_id, write_record


def test_records_never_overwrite(tmp_path):
    a = write_record(tmp_path, "2026-11-30-h200", {"run": 1}, "# one")
    b = write_record(tmp_path, "2026-11-30-h200", {"run": 2}, "# two\n")
    assert a[0].name == "2026-11-30-h200.json" and b[0].name == "2026-11-30-h200-2.json"
    assert json.loads(a[0].read_text()) == {"run": 1} and a[1].read_text() == "# one\n"
    assert json.loads(b[0].read_text()) == {"run": 2} and b[1].read_text() == "# two\n"
    (tmp_path / "x-2.md").write_text("taken")  # either file of a pair reserves the stem
    write_record(tmp_path, "x", {}, "")
    c = write_record(tmp_path, "x", {}, "")
    assert c[0].name == "x-3.json" and (tmp_path / "x-2.md").read_text() == "taken"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_commit_id(monkeypatch):
    monkeypatch.setenv("TRIT_COMMIT", "abc123+wip")
    assert commit_id() == "abc123+wip"
    monkeypatch.delenv("TRIT_COMMIT")
    c = commit_id()
    assert c == "unknown" or len(c.split("+")[0]) == 40


def test_e2e_state_resumes_across_calls(tmp_path, monkeypatch):
    """bench.e2e --state: a second call (a device call is at most 10 minutes) measures only the
    configs the first did not and writes one record with all of them; another commit does not
    resume. vLLM itself is faked: this checks the bookkeeping, not the timing."""
    import subprocess
    import types

    from bench import e2e

    ran = []

    def fake_run(cmd, **kw):
        label = cmd[cmd.index("--one") + 1]
        ran.append(label)
        assert (kw["env"].get("TRIT_A8_GEMM") == "1") == label.endswith("-gemm")  # a variant's environment
        tp = {"1": {"seconds": 0.1, "tok_s": 10.0 if label.startswith("bf16") else 20.0}}
        r = {"label": label, "throughput": tp, "ttft_ms": 1.0, "weights": {"bits_per_weight": 16.0}}
        if label == "ours-bitnet":
            r["graph_replay"] = {"1": {"ms": 42.5, "num_tokens": 1, "num_reqs": 1, "reps": 50}}
            r["engine_settings"] = {"async_scheduling": True, "max_num_seqs": 128, "cudagraph_mode": "FULL"}
        return types.SimpleNamespace(stdout="log\nRESULT " + json.dumps(r) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(e2e, "model_dir", lambda root, preset, unq: tmp_path / preset)
    monkeypatch.setenv("TRIT_COMMIT", "c1")
    common = ["--shape", "tiny", "--batches", "1", "--models", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
              "--state", str(tmp_path / "s")]
    assert e2e.main(common + ["--only", "ours-bitnet"]) == 0
    assert ran == ["ours-bitnet"]
    assert e2e.main(common + ["--only", "ours-bitnet,bf16-bitnet"]) == 0
    assert ran == ["ours-bitnet", "bf16-bitnet"]  # the first config came from the state
    recs = sorted((tmp_path / "o").glob("*-e2e-tiny*.json"), key=lambda p: len(p.name))  # x.json, x-2.json
    assert len(recs) == 2 and not list((tmp_path / "o").glob("partial-*"))
    last = json.loads(recs[-1].read_text())
    assert [r["label"] for r in last["rows"]] == ["ours-bitnet", "bf16-bitnet"] and last["resumed"] == ["ours-bitnet"]
    md = recs[-1].with_suffix(".md").read_text()
    assert "resumed: ours-bitnet" in md and "| ours-bitnet | 20 | 1.0 | - | 16.0 | 2.00x |" in md
    # the step per token (B / tok/s) beside the graph-replayed forward, for the configs that have one
    assert "| ours-bitnet | 50.000 | 42.500 |" in md and "| bf16-bitnet | 100.000 |" not in md
    assert "ours-bitnet async_scheduling=True, max_num_seqs=128, cudagraph_mode=FULL" in md
    monkeypatch.setenv("TRIT_COMMIT", "c2")  # another commit measures everything again
    assert e2e.main(common + ["--only", "ours-bitnet"]) == 0
    assert ran[-1] == "ours-bitnet" and len(ran) == 3
    # a kernel variant runs only when named, in the order named, with its environment
    assert e2e.main(common + ["--only", "ours-bitnet,ours-bitnet-gemm"]) == 0
    assert ran[-1] == "ours-bitnet-gemm" and len(ran) == 4
    rec = max((tmp_path / "o").glob("*-e2e-tiny*.md"), key=lambda p: p.stat().st_mtime_ns)
    assert "| ours-bitnet-gemm (TRIT_A8_GEMM=1) |" in rec.read_text()


def test_e2e_order_rounds_and_unknown_labels(tmp_path, monkeypatch):
    """bench.e2e runs the --only configs in the order named; --rounds N rotates that order by one config per round
    (every config takes every position), records each row's round and position, rates each row against its own
    round's bf16 and adds the per-round table with means; a label that is no config of the shape stops the run
    before anything is measured, naming it. vLLM is faked: the fake makes whichever config runs first in a round
    10% slower, as measured on the H200 (run 48)."""
    import subprocess
    import types

    from bench import e2e

    ran = []
    base = {"ours-bitnet": 20.0, "bf16-bitnet": 10.0, "ours-bitnet-gemm": 30.0}

    def fake_run(cmd, **kw):
        label = cmd[cmd.index("--one") + 1]
        ran.append((label, len(ran) // 3))
        tok = base[label] * (0.9 if len(ran) % 3 == 1 else 1.0)  # the first engine of each round of 3
        r = {"label": label, "throughput": {"1": {"seconds": 0.1, "tok_s": tok}}, "ttft_ms": 1.0,
             "weights": {"bits_per_weight": 16.0}}
        return types.SimpleNamespace(stdout="RESULT " + json.dumps(r) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(e2e, "model_dir", lambda root, preset, unq: tmp_path / preset)
    monkeypatch.setenv("TRIT_COMMIT", "c1")
    common = ["--shape", "tiny", "--batches", "1", "--models", str(tmp_path / "m"), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match="'ours' is not a config of shape 'tiny'.*ours-bitnet"):
        e2e.main(common + ["--only", "ours-bitnet,ours"])
    assert ran == []
    with pytest.raises(SystemExit):
        e2e.main(common + ["--rounds", "0"])
    assert e2e.main(common + ["--only", "bf16-bitnet,ours-bitnet-gemm,ours-bitnet", "--rounds", "3"]) == 0
    assert [l for l, _ in ran] == ["bf16-bitnet", "ours-bitnet-gemm", "ours-bitnet",
                                   "ours-bitnet-gemm", "ours-bitnet", "bf16-bitnet",
                                   "ours-bitnet", "bf16-bitnet", "ours-bitnet-gemm"]
    rec = json.loads(max((tmp_path / "o").glob("*-e2e-tiny*.json"), key=lambda p: p.stat().st_mtime_ns).read_text())
    assert rec["settings"]["rounds"] == 3
    assert [(r["label"], r["round"], r["position"]) for r in rec["rows"]][:4] == [
        ("bf16-bitnet", 1, 1), ("ours-bitnet-gemm", 1, 2), ("ours-bitnet", 1, 3), ("ours-bitnet-gemm", 2, 1)]
    md = max((tmp_path / "o").glob("*-e2e-tiny*.md"), key=lambda p: p.stat().st_mtime_ns).read_text()
    # round 1: bf16 ran first (9 tok/s): ours-bitnet 20 / 9; round 2: bf16 last (10): gemm first, 27 / 10
    assert "| ours-bitnet [round 1, #3] | 20 | 1.0 | - | 16.0 | 2.22x | - |" in md
    assert "| ours-bitnet-gemm (TRIT_A8_GEMM=1) [round 2, #1] | 27 | 1.0 | - | 16.0 | 2.70x | - |" in md
    # each config once in each position: the means carry the first-position penalty equally
    assert "| ours-bitnet | 20 (#3) | 20 (#2) | 18 (#1) | 19 | 2.000x |" in md
    assert "| bf16-bitnet | 9 (#1) | 10 (#3) | 10 (#2) | 10 | 1.000x |" in md


def test_e2e_profile_summary_by_category_and_kernel():
    """The batch-1 step profile: categories by the kernel-name rules (our a8 GEMM kernel is ternary
    work, inductor's norm fusions named after our op are not), per-step ms / launches, and each
    category's top kernels with their own share."""
    from bench import e2e

    steps = 4
    events = [("void (anonymous namespace)::a8_gemm_kernel<__nv_bfloat16, GemmCfg<2, 4, 4, 2>, false>", 400.0, 8),
              ("void (anonymous namespace)::quant_rows_perm_kernel<__nv_bfloat16>", 40.0, 8),
              ("triton_red_fused_fused_add_rms_norm_ternary_mm_a8_2", 80.0, 4),
              ("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT", 120.0, 4),
              ("cudaLaunchKernel", 0.0, 100)]
    out = e2e.summarize_profile(events, steps, wall_s=0.004, top=1)
    cats = out["by_category"]
    assert list(cats) == ["ternary", "dense_gemm", "norm_elementwise"]  # by time
    assert cats["ternary"]["ms_per_step"] == 0.11 and cats["ternary"]["launches_per_step"] == 4.0
    assert [k["name"][:40] for k in cats["ternary"]["kernels"]] == [events[0][0][:40]]  # top=1
    assert cats["ternary"]["kernels"][0]["ms_per_step"] == 0.1
    assert cats["norm_elementwise"]["kernels"][0]["launches_per_step"] == 1.0
    assert out["gpu_ms_per_step"] == 0.16 and out["wall_ms_per_step"] == 1.0
    assert "gpu_busy_ms_per_step" not in out  # no activity intervals given


def test_e2e_profile_busy_time_is_the_union_of_kernel_intervals():
    """GPU busy time from the activities' (start, end): overlapping kernels (a PDL launch running beside the one
    before) count once, gaps are idle; the summed durations' excess is the overlap."""
    from bench import e2e

    assert e2e.busy_union([]) == 0.0
    assert e2e.busy_union([(0, 10), (5, 12), (20, 25), (24, 24), (30, 29)]) == 17.0  # [0, 12) + [20, 25)
    assert e2e.busy_union([(20, 25), (0, 40), (1, 2)]) == 40.0  # contained, out of order
    iv = [(0.0, 1000.0), (800.0, 1500.0), (2000.0, 2600.0)]  # us: 2100 busy of 2300 summed, 2 steps
    out = e2e.summarize_profile([("k", 2300.0, 3)], steps=2, wall_s=0.004, intervals=iv)
    assert out["gpu_busy_ms_per_step"] == 1.05 and out["gpu_overlap_ms_per_step"] == 0.1
    assert out["gpu_idle_ms_per_step"] == 0.95  # (4000 - 2100) us / 2 steps


def test_kernel_bench_rejects_unknown_shape_group():
    """A typo in --shapes is named before any GPU work (not a KeyError halfway through the run)."""
    import pytest

    from bench import kernels

    with pytest.raises(SystemExit, match="unknown group.*13b.*known: all, 2b, 8b, 70b"):
        kernels.main(["--shapes", "8b,13b"])
    assert ("6144", "4096") == tuple(map(str, kernels.SHAPES["8b-vllm"][0]))  # vLLM's merged qkv of Llama-3-8B


def test_partial_rows_replace_each_other_and_go_with_the_record(tmp_path):
    from bench.records import drop_partial, write_partial
    p = write_partial(tmp_path, "2026-01-01-h200", {"meta": {"device": "x"}, "rows": [{"N": 1}]})
    assert json.loads(p.read_text())["rows"] == [{"N": 1}] and json.loads(p.read_text())["partial"]
    write_partial(tmp_path, "2026-01-01-h200", {"meta": {"device": "x"}, "rows": [{"N": 1}, {"N": 2}]})
    assert len(json.loads(p.read_text())["rows"]) == 2  # scratch: replaced, not numbered
    write_record(tmp_path, "2026-01-01-h200", {"rows": []}, "# r")
    drop_partial(tmp_path, "2026-01-01-h200")
    assert not p.exists() and (tmp_path / "2026-01-01-h200.json").exists()
    drop_partial(tmp_path, "2026-01-01-h200")  # idempotent


def test_e2e_engine_mode_sets_the_child_environment(tmp_path, monkeypatch):
    """bench.e2e --engine: each config's child runs with VLLM_ENABLE_V1_MULTIPROCESSING=0 (inproc, the
    default: profile and graph replay see the engine) or 1 (mp, vLLM's default serving setup), whatever
    the caller's environment says; the mp record is named -mp and says so."""
    import subprocess
    import types

    from bench import e2e

    seen = []

    def fake_run(cmd, **kw):
        seen.append(kw["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"])
        r = {"label": cmd[cmd.index("--one") + 1], "throughput": {"1": {"seconds": 0.1, "tok_s": 10.0}},
             "ttft_ms": 1.0, "weights": {"bits_per_weight": 2.0}}
        return types.SimpleNamespace(stdout="RESULT " + json.dumps(r) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(e2e, "model_dir", lambda root, preset, unq: tmp_path / preset)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("TRIT_COMMIT", "c1")
    common = ["--shape", "tiny", "--batches", "1", "--only", "ours-bitnet", "--models", str(tmp_path / "m"),
              "--out", str(tmp_path / "o")]
    assert e2e.main(common) == 0
    assert e2e.main(common + ["--engine", "mp"]) == 0
    assert seen == ["0", "1"]
    mp = list((tmp_path / "o").glob("*-e2e-tiny-mp.md"))
    assert len(mp) == 1 and "engine core in its own process" in mp[0].read_text()
    assert json.loads(mp[0].with_suffix(".json").read_text())["settings"]["engine"] == "mp"


def test_engine_settings_as_resolved():
    """bench.e2e.engine_settings reads what vLLM resolved (async scheduling decides whether the host
    work of a step overlaps the GPU's); fields this vLLM lacks come back as None, not an error."""
    from types import SimpleNamespace as NS

    from bench.e2e import engine_settings

    mode = NS(name="FULL_AND_PIECEWISE")
    llm = NS(llm_engine=NS(vllm_config=NS(scheduler_config=NS(async_scheduling=False, max_num_seqs=64),
                                           compilation_config=NS(cudagraph_mode=mode),
                                           attention_config=NS(flash_attn_max_num_splits_for_cuda_graph=1,
                                                               backend=NS(name="TRITON_ATTN")))))
    assert engine_settings(llm) == {"async_scheduling": False, "max_num_seqs": 64,
                                    "cudagraph_mode": "FULL_AND_PIECEWISE", "fa_max_splits": 1,
                                    "attn_backend": "TRITON_ATTN"}
    assert engine_settings(NS()) == {"async_scheduling": None, "max_num_seqs": None, "cudagraph_mode": None,
                                     "fa_max_splits": None, "attn_backend": None}


def test_chain_bench_markdown_and_tail_bytes():
    """bench.chain on the CPU: its floor arithmetic (the tail's packed bytes) and its record's Markdown from
    synthetic rows and phase stamps - so that a GPU run does not end in a formatting error."""
    from bench import chain

    # 2B tail: o_proj 2560x2560, gate_up 13824x2560, down 2560x6912 at 2 bits per weight
    assert chain.tail_bytes("2b") == (2560 * 2560 + 13824 * 2560 + 2560 * 6912) // 4
    rows = [{"tail": "2b", "variant": v, "us_per_tail": t, "floor_us": 3.57, "pct_of_ceiling": 17.0, "layers": 8,
             "chain_vs_pro_rel_diff": 0.0} for v, t in (("chain", 20.9), ("pro", 28.4))]
    rows.append({"tail": "2b", "variant": "bf16", "error": "RuntimeError: no"})
    prof = {"tail": "2b", "env": {}, "span_us": 1.0,
            "stages": [{p: {"median_us": 0.5, "max_us": 0.7} for p in chain.POINTS} | {"finish_skew_us": 0.1}] * 3}
    assert len(chain.POINTS) + 1 == 7  # the kernel's kChainStamps: one phase between two stamps
    meta = {"device": "H200", "date": "d", "commit": "c", "command": "python -m bench.chain", "torch": "t",
            "cuda": "u", "profiles": [prof]}
    md = chain.markdown(meta, rows)
    assert "| 2b | 1 | 20.9 | 28.4 | - | - | error |" in md, md
    assert "| 2b | - | 1.0 | 0 | 0.5 / 0.7 |" in md and "- 2b M=1 bf16: RuntimeError: no" in md, md
    # rows of another M get their own line
    md = chain.markdown(meta, rows + [{"tail": "2b", "m": 8, "variant": "chain", "us_per_tail": 30.5, "floor_us": 3.57,
                                       "pct_of_ceiling": 11.7, "layers": 8, "chain_vs_pro_rel_diff": 0.0}])
    assert "| 2b | 8 | 30.5 | - |" in md and "| 2b | 1 | 20.9 | 28.4 |" in md, md


def test_e2e_split1_variants_set_the_attention_engine_setting():
    """bench.e2e's -split1 variants: the base config's checkpoint with FlashAttention's KV split cap at 1
    (an engine argument), named only when asked for; a bad value is refused by name."""
    import pytest

    from bench import e2e

    cf = e2e.configs("2b", ["ours-bitnet", "ours-bitnet-split1", "bf16-llama-split1"])
    assert [c[0] for c in cf] == ["ours-bitnet", "ours-bitnet-split1", "bf16-llama-split1"]
    assert cf[1][1:4] == cf[0][1:4] and cf[2][3] is True  # same checkpoint; the bf16 twin stays unquantized
    assert e2e.engine_overrides(cf[1][4]) == {"attention_config": {"flash_attn_max_num_splits_for_cuda_graph": 1}}
    assert e2e.engine_overrides({}) == {}
    with pytest.raises(ValueError, match="TRIT_BENCH_ATTN_SPLITS='0'"):
        e2e.engine_overrides({"TRIT_BENCH_ATTN_SPLITS": "0"})
    both = e2e.configs("2b", ["ours-bitnet-chain-split1"])
    assert [c[0] for c in both] == ["ours-bitnet-chain-split1"] and both[0][1:4] == cf[0][1:4]
    assert both[0][4]["TRIT_CHAIN"] == "1"
    assert e2e.engine_overrides(both[0][4]) == e2e.engine_overrides(cf[1][4])


def test_e2e_tattn_variants_pick_the_attention_backend():
    """bench.e2e's -tattn variants: the base config's checkpoint under vLLM's Triton attention backend (an
    engine argument, for bf16 too); with the split cap both land in one attention_config; a malformed
    backend name is refused by name, before any engine starts."""
    import pytest

    from bench import e2e

    cf = e2e.configs("2b", ["ours-bitnet", "ours-bitnet-tattn", "bf16-llama-tattn"])
    assert [c[0] for c in cf] == ["ours-bitnet", "ours-bitnet-tattn", "bf16-llama-tattn"]
    assert cf[1][1:4] == cf[0][1:4] and cf[2][3] is True
    assert e2e.engine_overrides(cf[1][4]) == {"attention_config": {"backend": "TRITON_ATTN"}}
    assert e2e.engine_overrides({"TRIT_BENCH_ATTN_BACKEND": "TRITON_ATTN", "TRIT_BENCH_ATTN_SPLITS": "1"}) == {
        "attention_config": {"flash_attn_max_num_splits_for_cuda_graph": 1, "backend": "TRITON_ATTN"}}
    with pytest.raises(ValueError, match="TRIT_BENCH_ATTN_BACKEND='triton attn'"):
        e2e.engine_overrides({"TRIT_BENCH_ATTN_BACKEND": "triton attn"})
    pytest.importorskip("vllm")
    from vllm.config import AttentionConfig  # the name is one vLLM knows (0.26 and 0.32)
    assert AttentionConfig(**e2e.engine_overrides(cf[1][4])["attention_config"]).backend.name == "TRITON_ATTN"


def test_graph_launch_fit_and_markdown():
    """bench.graph_launch on the CPU: the per-node line through its rows and the record's table (the
    measurement itself needs a CUDA device, and says so)."""
    from bench import graph_launch as gl

    rows = [{"nodes": n, "reps": 200, "host_us_median": 4.0 + 0.5 * n, "host_us_p10": 3.0, "host_us_p90": 9.0,
             "gpu_us_per_replay": 2.0 * n} for n in (1, 100, 400)]
    line = gl.fit(rows)
    assert line == {"host_us_fixed": 4.0, "host_us_per_node": 0.5}
    meta = {"device": "X", "date": "d", "commit": "c", "command": "python -m bench.graph_launch", "torch": "t",
            "cuda": "12"}
    md = gl.markdown(meta, rows, line)
    assert "| 100 | 54.0 | 3.0 | 9.0 | 200.0 |" in md and "420-node decode graph: 214.0 us" in md, md
    if not __import__("torch").cuda.is_available():
        assert gl.main(["--out", "/nonexistent-never-written"]) == 2


def test_e2e_profile_batch_must_be_measured(tmp_path, capsys):
    """bench.e2e --profile-batch profiles a batch-B generation (the engine holds max(--batches) sequences), so
    it must be one of --batches: refused by name before any model is generated or engine started."""
    import pytest

    from bench import e2e

    with pytest.raises(SystemExit) as ex:
        e2e.main(["--shape", "tiny", "--batches", "1,8", "--profile-batch", "32", "--models", str(tmp_path / "m"),
                  "--out", str(tmp_path / "o")])
    assert ex.value.code == 2
    assert "--profile-batch 32: expected one of --batches 1,8" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()


def test_e2e_profile_batch_default_follows_batches(monkeypatch, tmp_path):
    """Without --profile-batch the profiled generation is batch 1 where --batches has it, else the smallest of
    --batches (`--batches 32` alone used to stop on the default 1: two lost device calls); an explicit batch that
    is not measured is accepted only with --profile-steps 0 (nothing profiled)."""
    from bench import e2e

    seen = []

    def fake_run_one(label, d, q, batches, prompt_len, gen_len, profile_steps, tp=1, profile_batch=1, replay_max=8):
        seen.append((batches, profile_steps, profile_batch))
        return {}

    monkeypatch.setattr(e2e, "run_one", fake_run_one)
    monkeypatch.setattr(e2e, "print", lambda *a, **k: None, raising=False)
    for argv, want in [(["--batches", "32"], 32), (["--batches", "8,32"], 8), (["--batches", "32,1"], 1),
                       (["--batches", "32", "--profile-steps", "0", "--profile-batch", "1"], 1)]:
        assert e2e.main(argv + ["--one", "ours", str(tmp_path), "-"]) == 0
        assert seen[-1][2] == want, (argv, seen[-1])


def test_kernel_bench_markdown_bitplane_section():
    """bench.kernels prints the bitplane layout (ternary_mm_a8_bp) beside the code layout at M <= 32, with the
    ratio and whether the results were equal; no section when no row has it."""
    from bench import kernels

    meta = {"device": "H200", "date": "d", "commit": "c", "command": "x", "torch": "t", "cuda": "u", "fused_max_m": 64}
    rows = [{"N": 2560, "K": 2560, "M": 1, "a8_us": 4.0, "a8_bp_us": 5.0, "a8_bp_equal": True, "floor_us": 0.4},
            {"N": 2560, "K": 2560, "M": 64, "a8_us": 9.0, "floor_us": 0.4}]
    md = kernels.markdown(meta, rows)
    assert "| 2560x2560 | 1 | 4.0 | 5.0 | 1.25 | True |" in md
    assert "| 2560x2560 | 64 |" in md and md.count("| 2560x2560 | 64 |") == 1  # only in the main table
    assert "bitplane" not in kernels.markdown(meta, rows[1:])
    assert "a8_bp" not in kernels.EXPERIMENTAL  # validated in H200 run 32


def test_kernel_bench_mt8_section():
    """bench.kernels at 32 < M <= 64: the default beside the MT = 8 GEMV forced on every layer, on the plain xq and
    with the loop quantizer, humming and the faster of ours against it; `equal` is False when any forced route's
    result differed; no section without the columns; fmt_row names the three."""
    from bench import kernels

    meta = {"device": "H200", "date": "d", "commit": "c", "command": "x", "torch": "t", "cuda": "u", "fused_max_m": 64}
    row = {"N": 8192, "K": 8192, "M": 64, "bf16_us": 43.1, "a8_us": 24.0, "a8_x_bf16": 43.1 / 24.0, "a8_mt8_us": 20.0,
           "a8_mt8_noxi_us": 30.5, "a8_mt8_xqloop_us": 21.0, "humming_us": 22.8, "floor_us": 4.0,
           "a8_mt8_equal": True, "a8_mt8_noxi_equal": True, "a8_mt8_xqloop_equal": True}
    md = kernels.markdown(meta, [row])
    assert "| 8192x8192 | 64 | 43.1 | 24.0 (1.80x) | 20.0 | 30.5 | 21.0 | 22.8 | 1.14x | True |" in md
    assert "| 8192x8192 | 64 | 43.1 | 24.0 (1.80x) | 20.0 | 30.5 | 21.0 | 22.8 | 1.14x | False |" in kernels.markdown(
        meta, [{**row, "a8_mt8_noxi_equal": False}])
    assert "mt8 20.0/30.5/21.0 " in kernels.fmt_row(row)
    plain = {k: v for k, v in row.items() if "mt8" not in k}
    assert "TRIT_A8_MT8_MAXW" not in kernels.markdown(meta, [plain])


def test_kernel_bench_quantizer_section():
    """bench.kernels' quantizer table: the default beside the cluster quantizer on every row (TRIT_QUANT_CLUSTER=1 / 8,
    behind the GEMV and the MT = 8 GEMV forced) and in front of the GEMM kernel (TRIT_A8_GEMM_QCL: the default route
    and the GEMM route forced, with the loop quantizer as gemmq0); `equal` False when any of them differed; no table
    without the columns; the GEMM ones (validated in H100 run 73) are no longer experimental, and gqcl0 (the loop
    kernel forced) has its own column."""
    from bench import kernels

    meta = {"device": "H100", "date": "d", "commit": "c", "command": "x", "torch": "t", "cuda": "u", "fused_max_m": 64}
    row = {"N": 2560, "K": 2560, "M": 128, "a8_us": 17.3, "a8_gqcl0_us": 17.4, "a8_gqcl1_us": 16.0, "a8_gqcl8_us": 15.5,
           "a8_gemmq0_us": 18.5, "a8_gemmq1_us": 14.2, "a8_gemmq8_us": 14.1, "humming_us": 13.5, "floor_us": 0.4,
           "a8_gemmq1_equal": True, "a8_gqcl8_equal": True}
    md = kernels.markdown(meta, [row])
    assert "| 2560x2560 | 128 | 17.3 | - | - / - / - | 17.4 / 16.0 / 15.5 | 18.5 / 14.2 / 14.1 | 13.5 | True |" in md
    assert "| 13.5 | False |" in kernels.markdown(meta, [{**row, "a8_gemmq8_equal": False}])
    m64 = {"N": 2560, "K": 6912, "M": 64, "a8_us": 12.0, "a8_mt8_us": 12.1, "a8_mt8_xqcl1_us": 10.9,
           "a8_mt8_xqcl8_us": 11.4, "floor_us": 1.0}
    assert "| 2560x6912 | 64 | 12.0 | - | 12.1 / 10.9 / 11.4 | - / - / - | - / - / - | - | True |" in \
        kernels.markdown(meta, [m64])
    assert "TRIT_A8_GEMM_QCL" not in kernels.markdown(meta, [{"N": 1, "K": 1, "M": 1, "a8_us": 1.0, "floor_us": 1.0}])
    assert not {"a8_gqcl0", "a8_gqcl1", "a8_gqcl8", "a8_gemmq1", "a8_gemmq8"} & set(kernels.EXPERIMENTAL)


def test_kernel_bench_head_prefetch_section():
    """bench.kernels --pf-head: a table of the a8 / fused times per TRIT_L2PF_HEAD beside the default, the
    pre-quantized GEMV and the whole-range prefetch; fmt_row names each head; no table without the columns."""
    from bench import kernels

    meta = {"device": "H200", "date": "d", "commit": "c", "command": "x", "torch": "t", "cuda": "u", "fused_max_m": 64}
    row = {"N": 28672, "K": 8192, "M": 1, "a8_us": 21.2, "fused_us": 26.9, "a8_pre_us": 18.8, "a8_nopf_us": 21.3,
           "a8_pf_us": 21.9, "a8_pfh16_us": 19.9, "fused_pfh16_us": 26.0, "a8_pfh4_us": 20.5, "floor_us": 14.1,
           "a8_fuseq_us": 37.7, "a8_fqnw8_us": 20.0}
    assert kernels.pf_head_keys(row) == [4, 16]
    md = kernels.markdown(meta, [row])
    assert "| head 4 | head 16 |" in md
    assert "| 28672x8192 | 1 | 21.2 / 26.9 | 18.8 | 21.3 / 21.9 | 20.5 / - | 19.9 / 26.0 | 37.7 / - / - / 20.0 |" in md
    assert "pfh4 20.5/- pfh16 19.9/26.0 fqnw8 20.0 " in kernels.fmt_row(row)
    plain = {k: v for k, v in row.items() if "pfh" not in k and "fqnw" not in k}
    assert "head prefetch" not in kernels.markdown(meta, [plain])


def test_e2e_ratio_column_names_its_batch(tmp_path, monkeypatch):
    """The record's ratio columns are taken at the first batch size measured and say so (run 43's B = 32-only
    record read "vs bf16 (B=1)")."""
    import subprocess
    import types

    from bench import e2e

    def fake_run(cmd, **kw):
        label, b = cmd[cmd.index("--one") + 1], cmd[cmd.index("--batches") + 1]
        r = {"label": label, "throughput": {b: {"seconds": 0.1, "tok_s": 10.0 if label.startswith("bf16") else 17.0}},
             "ttft_ms": 1.0, "weights": {"bits_per_weight": 16.0}}
        return types.SimpleNamespace(stdout="RESULT " + json.dumps(r) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(e2e, "model_dir", lambda root, preset, unq: tmp_path / preset)
    monkeypatch.setenv("TRIT_COMMIT", "c1")
    assert e2e.main(["--shape", "tiny", "--batches", "32", "--profile-batch", "32", "--models", str(tmp_path / "m"), "--out",
                     str(tmp_path / "o"), "--only", "ours-bitnet,bf16-bitnet"]) == 0
    md = next((tmp_path / "o").glob("*-e2e-tiny*.md")).read_text()
    assert "| vs bf16 (B=32) | vs humming (B=32) |" in md and "| ours-bitnet | 17 | 1.0 | - | 16.0 | 1.70x |" in md


@pytest.mark.parametrize("act,subnorm", [("silu", False), ("relu2", True)])
def test_chain_inductor_variants_run_the_same_tail_compiled(monkeypatch, act, subnorm):
    """bench.chain's -inductor variants (the e2e routes' Triton glue) on the CPU ops with a small tail of each
    family: the glue compiled by torch.compile gives the eager route's output and residual (a8 bit for bit up to
    the glue's rounding; the fnorm routes' norm is the op in both), and the compiled entry is really used."""
    import torch
    from bench import chain
    monkeypatch.setitem(chain.TAILS, "tiny", (64, 64, 96, act, subnorm))
    tails = chain.make_tails("tiny", 1, device="cpu")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    res = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    from torch._dynamo.utils import counters

    chain._COMPILED_GLUE.clear()
    try:
        for base in ("a8", "fnorm", "fnorm-tiled"):
            y0, r0 = chain.run_variant(base, tails[0], x, res)
            frames = counters["stats"]["unique_graphs"]
            y1, r1 = chain.run_variant(base + "-inductor", tails[0], x, res)
            if base == "a8":  # the first compiled route: one graph per glue kind (add + norm, act (+ norm))
                assert counters["stats"]["unique_graphs"] > frames, "a8-inductor compiled nothing"
            assert y1.shape == y0.shape == (3, 64) and torch.equal(r1, r0), base
            rel = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
            assert rel < 0.02, f"{base}: compiled glue differs from eager by {rel}"
    finally:
        chain._COMPILED_GLUE.clear()


def test_e2e_profile_subtracts_the_prefill():
    """The decode-step profile is the difference of two captures of the same prompts: steps + 1 tokens minus the
    prefill alone. Kernels only the prefill runs drop out (their counts do not grow), shared kernels keep the decode
    launches and time, wall / busy / overlap / idle and the host ops are differences too, all per decode step."""
    from bench import e2e

    gemm = "void (anonymous namespace)::a8_gemm_kernel<__nv_bfloat16, GemmCfg<2, 4, 4, 2>, false>"
    gemv = "void (anonymous namespace)::a8_small_kernel<__nv_bfloat16, 4, 1, false, false>"
    norm = "triton_red_fused_fused_add_rms_norm_ternary_mm_a8_2"
    prefill = {"wall_s": 0.010, "events": [(gemm, 4000.0, 4), (norm, 30.0, 1)],
               "host": [("cudaLaunchKernel", 50.0, 10)], "intervals": [(0.0, 3000.0), (2500.0, 4030.0)]}
    # the longer capture: the same prefill (timing noise on its GEMM), then 2 decode steps of 2 GEMVs + 1 norm
    full = {"wall_s": 0.014, "events": [(gemm, 4010.0, 4), (gemv, 400.0, 4), (norm, 50.0, 3)],
            "host": [("cudaLaunchKernel", 90.0, 18), ("cudaGraphLaunch", 20.0, 2)],
            "intervals": [(0.0, 3000.0), (2500.0, 4030.0), (5000.0, 5100.0), (5050.0, 5200.0), (5200.0, 5210.0),
                          (6000.0, 6100.0), (6050.0, 6200.0), (6200.0, 6210.0)]}
    out = e2e.profile_difference(full, prefill, steps=2)
    cats = out["by_category"]
    assert "dense_gemm" not in cats and [k["name"] for k in cats["ternary"]["kernels"]] == [gemv[:80]]
    assert cats["ternary"]["ms_per_step"] == 0.2 and cats["ternary"]["launches_per_step"] == 2.0
    assert cats["norm_elementwise"]["ms_per_step"] == 0.01 and cats["norm_elementwise"]["launches_per_step"] == 1.0
    assert out["wall_ms_per_step"] == 2.0 and out["gpu_ms_per_step"] == 0.21
    # busy: 4030 (prefill) vs 4030 + 2 x 210; overlap 500 vs 500 + 2 x 50; idle = wall - busy, differenced
    assert out["gpu_busy_ms_per_step"] == 0.21 and out["gpu_overlap_ms_per_step"] == 0.05
    assert out["gpu_idle_ms_per_step"] == 1.79  # ((14000 - 4450) - (10000 - 4030)) / 2 us
    assert out["host"]["self_cpu_ms_per_step"] == 0.03  # (40 + 20) us / 2
    assert out["prefill"]["wall_ms"] == 10.0 and out["prefill"]["gpu_ms"] == 4.03
    # the prefill's kernel at the same count with a smaller time (noise) is dropped, not negative
    out2 = e2e.profile_difference({**full, "events": [(gemm, 3990.0, 4), (gemv, 400.0, 4)]}, prefill, steps=2)
    assert list(out2["by_category"]) == ["ternary"] and out2["by_category"]["ternary"]["launches_per_step"] == 2.0
    import pytest
    with pytest.raises(ValueError, match="steps must be >= 1"):
        e2e.profile_difference(full, prefill, steps=0)


def test_e2e_replay_max_reaches_the_run_and_the_table(tmp_path, monkeypatch):
    """--replay-max 32: each config's run replays the forward graph up to B = 32 (passed to the per-config
    process) and the record's forward table has a B = 32 column - the A/B that resolves a route's cost above one
    token, where tok/s moves 5-7% between rounds (run 94b). The default (8) leaves B = 32 out of both; the
    compile-cache variables set for the call are in the record's environment (run 95 set one by hand)."""
    import subprocess
    import types

    from bench import e2e

    seen = []

    def fake_run(cmd, **kw):
        label, bs = cmd[cmd.index("--one") + 1], cmd[cmd.index("--batches") + 1].split(",")
        rmax = int(cmd[cmd.index("--replay-max") + 1])
        seen.append(rmax)
        r = {"label": label, "throughput": {b: {"seconds": 0.1, "tok_s": 10.0 * int(b)} for b in bs},
             "ttft_ms": 1.0, "weights": {"bits_per_weight": 2.0},
             "graph_replay": {b: {"ms": 1.0 + int(b) / 100} for b in bs if int(b) <= rmax}}
        return types.SimpleNamespace(stdout="RESULT " + json.dumps(r) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(e2e, "model_dir", lambda root, preset, unq: tmp_path / preset)
    monkeypatch.setenv("TRIT_COMMIT", "c1")
    monkeypatch.setenv("VLLM_USE_MEGA_AOT_ARTIFACT", "1")
    for rmax, out in ((None, "o8"), ("32", "o32")):
        extra = ["--replay-max", rmax] if rmax else []
        assert e2e.main(["--shape", "tiny", "--batches", "1,32", "--models", str(tmp_path / "m"), "--out",
                         str(tmp_path / out), "--only", "ours-bitnet", "--profile-steps", "0"] + extra) == 0
        md = next((tmp_path / out).glob("*-e2e-tiny*.md")).read_text()
        assert "| B=1 forward (graph)" in md
        assert ("| B=32 forward (graph)" in md) == (rmax == "32"), md
        assert "'VLLM_USE_MEGA_AOT_ARTIFACT': '1'" in md
    assert seen == [8, 32]


def test_host_load_counts_own_threads_and_other_processes():
    """bench.e2e's host sampler around the timed runs: a thread of this process that burns 0.3 s of CPU shows in
    own_cores, a child process that burns 0.3 s in other_cores and other_procs (by pid) - measured by CPU time, so
    the assertions hold however loaded the machine is; placement names the CPUs this process may run on."""
    import subprocess
    import threading

    from bench.e2e import host_load, host_markdown, host_sample, placement

    if host_sample() is None:
        pytest.skip("no Linux /proc")

    def burn():
        t = time.thread_time()
        while time.thread_time() - t < 0.3:
            pass

    s0 = host_sample()
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nprint('done', flush=True)\n"
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    th = threading.Thread(target=burn)
    th.start()
    th.join()  # (the thread has exited: its CPU time counts in the process's)
    assert child.stdout.readline().strip() == "done"
    s1 = host_sample()  # (the child is alive, waiting on its stdin)
    child.communicate("")
    h = host_load(s0, s1, top=100)
    own_s, other_s = h["own_cores"] * h["wall_s"], h["other_cores"] * h["wall_s"]
    assert own_s >= 0.25 and other_s >= 0.25, h
    kid = [p for p in h["other_procs"] if p["pid"] == child.pid]
    assert kid and kid[0]["cores"] * h["wall_s"] >= 0.25, h["other_procs"][:5]
    assert h["machine_cores"] >= h["own_cores"] and isinstance(h["own_threads"], list)
    pl = placement()
    assert pl["cpus"] >= 1 and isinstance(pl["cpu_numa_nodes"], list)
    row = {"label": "ours-x", "throughput": {"1": {"tok_s": 1.0, "host": h}}, "placement": pl}
    md = "\n".join(host_markdown([row, {"label": "no-host", "throughput": {"1": {"tok_s": 1.0}}}], [1]))
    assert f"| ours-x | {h['own_cores']:.2f} / {h['other_cores']:.2f} |" in md and "no-host" not in md
    assert host_load(None, s1) is None and host_markdown([], [1]) == []
