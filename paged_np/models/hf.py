"""Read (and write) a Llama checkpoint as a Hugging Face model directory.

``load_hf(path) -> (config, weights, tokenizer)`` reads what transformers
reads: ``config.json`` (the architecture and its sizes), every
``*.safetensors`` file (through safetensors' NumPy API: no PyTorch),
``tokenizer.json`` (through ``tokenizers``) and the chat template from
``tokenizer_config.json``. Same output as :func:`paged_np.models.gguf.load_gguf`,
so the model cannot tell the two apart.

Unlike GGUF, nothing is permuted here: a Hugging Face checkpoint keeps Q and
K in the order transformers' rotate-half RoPE expects. The only transforms are
:func:`~paged_np.models.gguf.to_in_out` (checkpoints store ``[out, in]``,
we multiply ``x @ w`` with ``[in, out]``), a float32 cast (:func:`to_float32`,
which also reads bfloat16, a type NumPy lacks) and tying the LM head.

:func:`save_hf` writes the other way, so the tests can make a tiny
checkpoint and ``tests/data/make_golden.py`` can hand SmolLM2's dequantized
GGUF weights to transformers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..registry import architecture_for, supported_names
from .gguf import to_in_out
from .tokenizer import Tokenizer

#: config.json architecture names with a model here (from :data:`paged_np.registry.ARCHITECTURES`).
SUPPORTED_ARCHITECTURES = supported_names("hf")

#: Hugging Face tensor name -> our weight name; ``model.layers.N.`` names go to
#: layer ``N`` of a stacked array.
HF_NAMES = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "final_norm",
    "lm_head.weight": "lm_head",
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def config_from_hf(cfg: dict, where: Path) -> ModelConfig:
    """A :class:`ModelConfig` from a ``config.json`` dict."""
    archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{where}: architecture {archs[0]!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)})")
    if cfg.get("rope_scaling"):
        raise ModelLoadError(f"{where}: rope_scaling {cfg['rope_scaling']!r} is not supported "
                             "(plain RoPE only)")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ModelLoadError(f"{where}: bias terms (attention_bias / mlp_bias) are not supported")
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            sliding_window=cfg.get("sliding_window") or None,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            architecture=architecture_for(archs[0], "hf"),
        )
    except KeyError as e:
        raise ModelLoadError(f"{where}: config.json lacks {e}") from e


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Checkpoint dtype -> float32; bfloat16 is the top half of a float32, so shift it in."""
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


def _read_safetensors(path: Path) -> dict:
    """``{name: float32 array}`` from one ``.safetensors`` file.

    safetensors' NumPy API reads every dtype NumPy has; bfloat16 it cannot
    give as NumPy, so those tensors are read as raw uint16 from the header's
    offsets (the format is an 8-byte length, a JSON header, then the bytes).
    """
    from safetensors import safe_open

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    out = {}
    bf16 = {k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "BF16"}
    with safe_open(str(path), framework="np") as f:
        for name in f.keys():
            if name not in bf16:
                out[name] = to_float32(f.get_tensor(name), header[name]["dtype"])
    if bf16:
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name in bf16:
            a, b = header[name]["data_offsets"]
            raw = np.array(data[a:b]).view(np.uint16).reshape(header[name]["shape"])
            out[name] = to_float32(raw, "BF16")
        del data
    return out


def load_hf(path) -> tuple[ModelConfig, dict, Tokenizer]:
    """Read a Hugging Face Llama directory: ``(config, {our_name: float32 array}, tokenizer)``."""
    from .llama import weight_shapes

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: no config.json; a Hugging Face model directory holds "
                             "config.json, *.safetensors and tokenizer.json")
    cfg = config_from_hf(json.loads((path / "config.json").read_text()), path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        extra = " (only PyTorch .bin files: convert them to safetensors)" \
            if list(path.glob("*.bin")) else ""
        raise ModelLoadError(f"{path}: no *.safetensors files{extra}")
    tokenizer = Tokenizer.from_hf_dir(path)
    shapes = weight_shapes(cfg)
    weights = {name: np.empty(shape, dtype=np.float32) for name, shape in shapes.items()}
    seen = set()
    for file in files:
        for hname, w in _read_safetensors(file).items():
            m = _LAYER.match(hname)
            layer, key = (int(m.group(1)), m.group(2)) if m else (None, hname)
            ours = HF_NAMES.get(key)
            if ours is None:
                if key.endswith("rotary_emb.inv_freq"):
                    continue                                     # recomputed from rope_theta
                raise ModelLoadError(f"{file.name}: unexpected tensor {hname}")
            if ours == "lm_head" and cfg.tie_word_embeddings:
                continue                                         # some files store the tied copy
            if w.ndim == 2 and ours != "embed":
                w = to_in_out(w)                                 # [in, out]
            target = weights[ours] if layer is None else weights[ours][layer]
            if w.shape != target.shape:
                raise ModelLoadError(f"{hname}: shape {w.shape} does not fit {ours} "
                                     f"{target.shape} of config.json")
            target[...] = w
            seen.add((ours, layer))
    expected = {(n, None) for n in ("embed", "final_norm", "lm_head") if n in weights}
    expected |= {(n, i) for n in shapes if n not in ("embed", "final_norm", "lm_head")
                 for i in range(cfg.num_layers)}
    missing = sorted(expected - seen, key=str)
    if missing:
        raise ModelLoadError(f"{path}: missing tensors for {missing[:4]}"
                             f"{' ...' if len(missing) > 4 else ''}")
    return cfg, weights, tokenizer


def save_hf(path, cfg: ModelConfig, weights: dict, tokenizer: Tokenizer | None = None) -> Path:
    """Write ``(cfg, weights[, tokenizer])`` as a Hugging Face Llama directory (float32).

    ``weights`` uses our names and ``[in, out]`` layout (e.g. ``model.w``);
    transformers' ``LlamaForCausalLM.from_pretrained(path)`` loads the result.
    """
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ours_to_hf = {v: k for k, v in HF_NAMES.items()}
    tensors = {}
    for ours, w in weights.items():
        if ours == "lm_head" and cfg.tie_word_embeddings:
            continue
        if ours not in ours_to_hf:
            continue
        hname = ours_to_hf[ours]
        if ours in ("embed", "final_norm", "lm_head"):
            tensors[hname] = np.ascontiguousarray(w.T if ours == "lm_head" else w)
        else:
            for i in range(cfg.num_layers):
                wi = w[i]
                tensors[f"model.layers.{i}.{hname}"] = np.ascontiguousarray(
                    wi.T if wi.ndim == 2 else wi)                # back to [out, in]
    save_file({k: v.astype(np.float32) for k, v in tensors.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": False,
        "mlp_bias": False, "max_position_embeddings": cfg.max_position_embeddings,
        "torch_dtype": "float32",
    }
    if tokenizer is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
        config["eos_token_id"] = tokenizer.eos_token_id
        tokenizer._tok.save(str(path / "tokenizer.json"))
        tcfg = {"tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": tokenizer.id_to_token(tokenizer.eos_token_id),
                "add_bos_token": False, "clean_up_tokenization_spaces": False,
                "model_max_length": cfg.max_position_embeddings}
        if tokenizer.bos_token_id is not None:
            tcfg["bos_token"] = tokenizer.id_to_token(tokenizer.bos_token_id)
        if tokenizer.chat_template is not None:
            tcfg["chat_template"] = tokenizer.chat_template
        (path / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
        (path / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
