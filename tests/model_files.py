"""Tiny checkpoints the loader tests write themselves: GGUF (as llama.cpp's converter
writes it, Q/K rows permuted) and a Hugging Face directory."""

from __future__ import annotations

import json

import numpy as np

import paged_np as pnp
from paged_np.models.gguf import permute_qk
from paged_np.models.llama import weight_shapes

# Sizes whose every "in" dimension is a multiple of 32, the quantization block.
TINY_REAL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                 intermediate_size=128, rope_theta=100000.0, rms_norm_eps=1e-5,
                 max_position_embeddings=512)

GGUF_LAYER_NAMES = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
                    "wo": "attn_output", "mlp_norm": "ffn_norm", "w_gate": "ffn_gate",
                    "w_up": "ffn_up", "w_down": "ffn_down"}


def tiny_real_model(tokenizer, tied=True, seed=0) -> pnp.LlamaModel:
    cfg = pnp.ModelConfig(vocab_size=tokenizer.vocab_size, tie_word_embeddings=tied, **TINY_REAL)
    return pnp.LlamaModel.random(cfg, seed=seed)


def quant_round_trip(w: np.ndarray, type_name: str) -> np.ndarray:
    """What a weight becomes after quantize + dequantize (per row of ``[out, in]``)."""
    import gguf

    if type_name == "F32":
        return w
    qtype = gguf.GGMLQuantizationType[type_name]
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)


def quantized_reference(model: pnp.LlamaModel, type_name: str) -> pnp.LlamaModel:
    """The model whose weights went through the same quantization as the file (norms F32)."""
    out = {}
    for name in weight_shapes(model.cfg):
        w = model.w[name]
        if name.endswith("norm"):
            out[name] = w
        elif name == "embed":
            out[name] = quant_round_trip(w, type_name)
        elif name == "lm_head":
            out[name] = quant_round_trip(w.T, type_name).T
        else:
            out[name] = np.stack([quant_round_trip(wi.T, type_name).T for wi in w])
    return pnp.LlamaModel(model.cfg, out)


def tokenizer_fields(tok):
    spec = json.loads(tok._tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [None] * tok.vocab_size
    for t, i in vocab.items():
        tokens[i] = t
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
    specials = {a["id"] for a in spec["added_tokens"] if a["special"]}
    types = [3 if i in specials else 1 for i in range(tok.vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges


def write_gguf(path, model: pnp.LlamaModel, tok, type_name: str = "F32", arch: str = "llama",
               permute: bool = True, raw_tensors: dict | None = None) -> None:
    """Write ``model`` and ``tok`` as llama.cpp's converter would: ``[out, in]`` tensors,
    Q and K rows permuted (unless ``permute=False``), matrices as ``type_name``, norms F32."""
    import gguf

    cfg = model.cfg
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    tokens, types, merges = tokenizer_fields(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tok.chat_template)
    qtype = gguf.GGMLQuantizationType[type_name]
    raw_tensors = raw_tensors or {}

    def add(name, arr, quantize=True):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if name in raw_tensors:
            data, raw_type = raw_tensors[name]
            w.add_tensor(name, data, raw_dtype=raw_type)
        elif quantize and type_name != "F32":
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)

    add("token_embd.weight", model.w["embed"])
    add("output_norm.weight", model.w["final_norm"], quantize=False)
    if not cfg.tie_word_embeddings:
        add("output.weight", model.w["lm_head"].T)
    for i in range(cfg.num_layers):
        for ours, theirs in GGUF_LAYER_NAMES.items():
            wi = model.w[ours][i]
            if wi.ndim == 1:
                add(f"blk.{i}.{theirs}.weight", wi, quantize=False)
                continue
            wi = wi.T                                            # [out, in], checkpoint order
            if permute and ours == "wq":
                wi = permute_qk(wi, cfg.num_heads)
            elif permute and ours == "wk":
                wi = permute_qk(wi, cfg.num_kv_heads)
            add(f"blk.{i}.{theirs}.weight", wi)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
