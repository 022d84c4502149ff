"""transformers as a target: the oracle for the reference model.

Loads the packed checkpoint with transformers' own BitNet quantizer (BitLinear /
AutoBitLinear, HF-BitNet unpacking, per-token int8 activation quantisation) and captures
the canonical intermediates with forward hooks.  fp32, eager attention.
"""
from __future__ import annotations

from pathlib import Path

import torch

from reference.checkpoint import Checkpoint, CheckpointError, gguf_source, load_config
from reference.config import MODEL_TYPES, ONEBIT_LLM, ModelConfig
from reference.spec import not_converted, spec_from_hf_bitnet

from .base import Target


def _float_lm_head(model_dir: Path) -> bool:
    """The checkpoint's output embedding is a float matrix (a stored float lm_head.weight, or none: tied)."""
    from reference.checkpoint import Checkpoint

    ck = Checkpoint(model_dir)
    return "lm_head.weight" not in ck or ck.info("lm_head.weight").dtype in ("F32", "F16", "BF16")


class TransformersTarget(Target):
    name = "transformers"
    compute_dtype = "fp32"
    bit_faithful = True

    def faithful_for(self, model_dir) -> bool:
        """Not for quantization_mode 'online' checkpoints: transformers ternarizes the float latent weights and
        quantizes activations in torch.compile'd WeightQuant / ActQuant, whose fp32 results differ from any
        eager formula by an ulp (measured: ~3e-7 at the first quantized layer), which moves int8 activation
        steps - an independent fp32 implementation there, judged on the fp32-a8 tiers."""
        if model_dir is None or not self.bit_faithful:
            return bool(self.bit_faithful)
        q = ModelConfig.load(Path(model_dir)).quantization or {}
        return not (q.get("quant_method") == "bitnet" and q.get("quantization_mode") == "online")

    def load(self, model_dir: Path):
        from transformers import AutoModelForCausalLM

        if gguf_source(Path(model_dir)) is not None:
            # transformers' own GGUF loading (gguf_file=) dequantizes to a float model of its architectures, not
            # bitnet.cpp's; the reference and the vllm target read GGUF models (reference.gguf)
            raise ValueError(f"{model_dir}: a GGUF model: the transformers target loads Hugging Face checkpoints "
                             f"(config.json + safetensors) only; use the reference, bf16 or vllm target, or convert "
                             f"it first (python -m reference.gguf FILE OUTDIR)")
        from reference.spec import SPEC_FILENAME, CheckpointSpec

        if (Path(model_dir) / SPEC_FILENAME).is_file():  # the inspector's findings about this directory
            try:
                spec = CheckpointSpec.load(Path(model_dir) / SPEC_FILENAME)
            except Exception:  # not this target's input (it reads config.json): a spec others refuse stays theirs
                spec = None
            rope = sorted(m for m, e in spec.linears.items() if e.rope_interleave is not None) if spec else []
            if rope:  # transformers reads q / k rows as stored: RoPE would rotate the wrong pairs in every layer
                raise ValueError(f"{model_dir}: {SPEC_FILENAME} says {rope[0]} ({len(rope)} such) stores its rows in "
                                 f"interleaved-RoPE order (rope_interleave), which transformers does not undo: "
                                 f"transformers is no oracle for this checkpoint; use the reference, bf16 or vllm "
                                 f"target")
        cfg = ModelConfig.load(model_dir)
        archs = load_config(model_dir).get("architectures") or []
        if ONEBIT_LLM in archs:
            # 1bitLLM's class is remote code: transformers would build a float LlamaForCausalLM from model_type
            # llama (no sub-norms, no ternarisation) and load the latent weights into it - wrong, not an oracle
            raise ValueError(f"{model_dir}: architectures {archs}: {ONEBIT_LLM} (1bitLLM) is remote code that "
                             f"transformers does not implement; from model_type 'llama' it would build a float "
                             f"LlamaForCausalLM without the sub-norms or the ternarisation: transformers is no oracle "
                             f"for this checkpoint; use the reference, bf16 or vllm target")
        model_type = load_config(model_dir).get("model_type")
        if MODEL_TYPES.get(model_type, cfg.arch) != cfg.arch:
            # AutoModelForCausalLM picks the class of model_type's config, not of architectures (which the reference
            # and vLLM follow): a BitNet without its sub-norms, or a Llama with them left unloaded
            raise ValueError(f"{model_dir}/config.json: architectures {archs} (a {cfg.arch} model) but model_type "
                             f"{model_type!r}: transformers builds its {MODEL_TYPES[model_type]} class from "
                             f"model_type, the reference and vLLM the {cfg.arch} one: transformers is no oracle for "
                             f"this checkpoint; use the reference, bf16 or vllm target (or make model_type "
                             f"{cfg.arch!r})")
        if (cfg.quantization or {}).get("quant_method") == "bitnet":
            # transformers' BitLinear unpacks 4 output rows per byte and keeps the padding rows
            try:
                linears = spec_from_hf_bitnet(cfg, Checkpoint(model_dir)).linears
            except CheckpointError:
                linears = {}  # a mode the reference does not read (transformers may)
            if "lm_head" in linears and cfg.tie_word_embeddings:
                raise ValueError(f"{model_dir}: config.json ties the embeddings and the checkpoint stores a BitLinear "
                                 f"lm_head ({linears['lm_head'].weight_key!r}): transformers fails to load it "
                                 f"(BitLinear keeps its weight as a buffer, which tie_weights cannot compare: "
                                 f"'`weight` is not an nn.Parameter'); the reference and vLLM use it untied: use the "
                                 f"reference or vllm target")
            # quantization_mode online: AutoBitLinear is an nn.Linear over the float latent weight (any shape; the
            # bias added by F.linear, no weight_scale), so neither the packing nor the offline bias rule below holds
            online = (cfg.quantization or {}).get("quantization_mode") == "online"
            biased = [m for m, e in linears.items() if e.bias_key]
            if biased and (cfg.quantization or {}).get("linear_class") == "autobitlinear" and not online:
                raise ValueError(f"{model_dir}: transformers' offline AutoBitLinear multiplies the bias by "
                                 f"weight_scale ((x T + b) * s, unlike its online mode and BitLinear), the reference "
                                 f"and vLLM add it after the scale ({biased[0]} and {len(biased) - 1} more): "
                                 f"transformers is no oracle for this checkpoint")
            skip = (cfg.quantization or {}).get("modules_to_not_convert")
            if skip is not None and not not_converted(skip)("lm_head") and _float_lm_head(model_dir):
                # transformers adds its default skips (lm_head, the output embedding) only when the list is null
                # (HfQuantizer.get_modules_to_not_convert) and then makes lm_head a BitLinear, which a float
                # lm_head / tied embedding does not fit (a shape error or 'weight is not an nn.Parameter' mid-run)
                raise ValueError(f"{model_dir}/config.json: quantization_config.modules_to_not_convert={skip!r} does "
                                 f"not list 'lm_head', so transformers converts lm_head to a BitLinear, unlike the "
                                 f"reference and vLLM (a float lm_head); add 'lm_head' to the list for transformers "
                                 f"to serve as the oracle")
            odd = {} if online else {m: e.shape[0] for m, e in linears.items() if e.shape[0] % 4}
            if odd:
                m, n = next(iter(odd.items()))
                raise ValueError(f"{model_dir}: transformers' BitLinear cannot hold {m} ({n} output features, "
                                 f"not a multiple of 4; {len(odd)} such modules): use the reference or vllm target")

        elif not (cfg.quantization or {}).get("quant_method"):
            # without a quantization_config transformers builds plain nn.Linear layers: integer (packed) weights do
            # not fit them, and it fails with a size-mismatch dump that names neither the format nor what to do
            ck = Checkpoint(model_dir)
            packed = [f"{m}.weight" for m in cfg.linear_shapes() if f"{m}.weight" in ck
                      and ck.info(f"{m}.weight").dtype not in ("F32", "F16", "BF16", "F64")]
            if packed:
                info = ck.info(packed[0])
                raise ValueError(f"{model_dir}: {packed[0]} is stored as {info.dtype} {list(info.shape)} ({len(packed)} "
                                 f"such linear weights) and config.json has no quantization_config, so transformers "
                                 f"builds float linears (its BitNet integration needs quant_method 'bitnet' and that "
                                 f"packing): transformers is no oracle "
                                 f"for this checkpoint; use the reference, bf16 or vllm target (after `python -m "
                                 f"reference.inspect` for an undocumented format)")
        model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                           attn_implementation="eager", output_loading_info=True)
        missing = sorted(info.get("missing_keys") or ())
        if missing:  # transformers initialises those at random and goes on: its outputs would be noise, read as a
            # divergence of every layer (a Meta / GGUF-named checkpoint loads nothing under transformers' names)
            from reference.spec import UNTIED_HEAD_HINT

            why = UNTIED_HEAD_HINT if missing == ["lm_head.weight"] else "tensor names not transformers'?"
            raise ValueError(f"{model_dir}: transformers found no checkpoint tensor for {len(missing)} of its "
                             f"parameters ({missing[:4]}{' ...' if len(missing) > 4 else ''}) and would initialise "
                             f"them at random: transformers is no oracle for this checkpoint ({why}); use the "
                             f"reference, bf16 or vllm target")
        return model.eval()

    def capture(self, model_dir, input_ids, *, spec_path=None):
        if spec_path is not None:
            raise ValueError("the transformers target reads config.json's quantization_config, not a spec file")
        cfg = ModelConfig.load(model_dir)
        model = self.load(Path(model_dir))
        out: dict[str, torch.Tensor] = {}
        hooks = []

        def save(name, t):
            out[name] = t.detach().float().clone()

        def on_out(name):
            return lambda m, args, res: save(name, res[0] if isinstance(res, tuple) else res)

        def on_in(name):
            return lambda m, args: save(name, args[0])

        inner = model.model
        hooks.append(inner.embed_tokens.register_forward_hook(on_out("embed")))
        for L, layer in enumerate(inner.layers):
            n = f"layer{L}"
            att, mlp = layer.self_attn, layer.mlp
            hooks += [
                layer.input_layernorm.register_forward_hook(on_out(f"{n}.input_norm")),
                att.q_proj.register_forward_hook(on_out(f"{n}.attn.q_proj")),
                att.k_proj.register_forward_hook(on_out(f"{n}.attn.k_proj")),
                att.v_proj.register_forward_hook(on_out(f"{n}.attn.v_proj")),
                att.o_proj.register_forward_hook(on_out(f"{n}.attn.o_proj")),
                layer.post_attention_layernorm.register_forward_hook(on_out(f"{n}.post_attn_norm")),
                mlp.gate_proj.register_forward_hook(on_out(f"{n}.mlp.gate_proj")),
                mlp.up_proj.register_forward_hook(on_out(f"{n}.mlp.up_proj")),
                mlp.down_proj.register_forward_hook(on_out(f"{n}.mlp.down_proj")),
                layer.register_forward_hook(on_out(f"{n}.output")),
            ]
            if cfg.arch == "bitnet":
                hooks += [
                    att.attn_sub_norm.register_forward_pre_hook(on_in(f"{n}.attn.attn_out")),
                    att.attn_sub_norm.register_forward_hook(on_out(f"{n}.attn.sub_norm")),
                    mlp.ffn_sub_norm.register_forward_pre_hook(on_in(f"{n}.mlp.act")),
                    mlp.ffn_sub_norm.register_forward_hook(on_out(f"{n}.mlp.sub_norm")),
                ]
            else:
                hooks += [
                    att.o_proj.register_forward_pre_hook(on_in(f"{n}.attn.attn_out")),
                    mlp.down_proj.register_forward_pre_hook(on_in(f"{n}.mlp.act")),
                ]
        hooks.append(inner.norm.register_forward_hook(on_out("final_norm")))
        try:
            with torch.no_grad():
                logits = model(input_ids=input_ids, use_cache=False).logits
        finally:
            for h in hooks:
                h.remove()
        save("logits", logits)
        return out

    def generate(self, model_dir, input_ids, max_new_tokens, *, spec_path=None):
        model = self.load(Path(model_dir))
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 attention_mask=torch.ones_like(input_ids))
        return out[:, input_ids.shape[1]:]
