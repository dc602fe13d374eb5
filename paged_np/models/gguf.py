"""Read a Llama checkpoint from a GGUF file (llama.cpp's format) into plain arrays.

``load_gguf(path) -> (config, weights, tokenizer)`` is a pure function: it
opens the file with ``gguf`` (llama.cpp's own Python reader), builds a
:class:`~paged_np.ModelConfig` from the metadata, turns every tensor into a
float32 NumPy array under our name, builds the :class:`Tokenizer` from the
vocabulary stored in the file, and closes the file. The model never sees
GGUF.

Each transform a GGUF tensor needs is one named function below:

- :func:`dequantize`: quantized blocks -> float32 (``gguf.quants.dequantize``);
- :func:`unpermute_qk`: undo the row order the converter gave Q and K;
- :func:`to_in_out`: ``[out, in]`` -> ``[in, out]``, our ``y = x @ w`` layout;
- tying: a file without ``output.weight`` uses the embedding as LM head
  (``ModelConfig.tie_word_embeddings``).

**The Q/K permutation trap.** Llama's RoPE rotates each head's vector as two
halves: dimension ``i`` is paired with ``i + D/2`` (transformers'
``rotate_half``). llama.cpp's kernel instead pairs *adjacent* dimensions
``(2i, 2i+1)``. So when ``convert_hf_to_gguf.py`` writes a Llama, it
reorders the rows of ``attn_q`` and ``attn_k`` within each head, interleaving
the two halves: row ``2i`` is the old row ``i``, row ``2i+1`` the old row
``i + D/2``. Read those rows as they are and run rotate-half RoPE, and the
rotation pairs the wrong dimensions: attention scores become nonsense while
every shape still fits (SmolLM2's first greedy token is then EOS). Two fixes
work: undo the permutation on load (done here: our RoPE stays transformers'),
or keep the rows and rotate adjacent pairs. A second, smaller trap: for K the
converter permutes with the number of *KV* heads (GQA), so unpermuting K with
the query head count scrambles it too. Q and K only: V and the output
projection are never rotated, so the converter leaves them alone (and a
consistent reordering of Q and K together would not change ``q . k`` anyway;
this one is not consistent with rotate-half).

Quantized tensors are either dequantized to float32 on load
(``quantization=None``: a 135M model is 513 MiB that way) or, by default,
kept as the file's blocks (:func:`_read_quantized`, 106 MiB) for
:mod:`paged_np.quant`'s kernels, as llama.cpp multiplies them.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import numpy as np

from ..config import ModelConfig
from ..errors import InvalidArgument, ModelLoadError
from ..registry import architecture_for, supported_names
from .tokenizer import Tokenizer

#: Tensor types this loader dequantizes (each tested on a file the tests write).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")

#: GGUF architecture names with a model here (from :data:`paged_np.registry.ARCHITECTURES`).
SUPPORTED_ARCHITECTURES = supported_names("gguf")

#: GGUF tensor name -> our weight name. ``blk.N.`` tensors go to layer ``N`` of a
#: stacked ``[num_layers, ...]`` array.
GGUF_NAMES = {
    "token_embd.weight": "embed",
    "output_norm.weight": "final_norm",
    "output.weight": "lm_head",
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_output.weight": "wo",
    "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
}

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


# ---------------------------------------------------------------------------
# The transforms, one reason each.
# ---------------------------------------------------------------------------
def dequantize(data: np.ndarray, type_name: str, tensor_name: str) -> np.ndarray:
    """Quantized blocks -> float32, numpy shape ``[out, in]`` (GGUF stores ``[in, out]``
    in ggml's reversed order, which is numpy's ``[out, in]``)."""
    import gguf

    if type_name not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"{tensor_name}: quantization type {type_name} is not supported (supported: "
            f"{', '.join(SUPPORTED_TYPES)}); re-quantize the model with llama.cpp's "
            "llama-quantize to Q8_0 or Q4_1, or use its Hugging Face directory")
    qtype = gguf.GGMLQuantizationType[type_name]
    return np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo the converter's interleaving of each head's two RoPE halves (the trap in the
    module docstring). ``w`` is ``[heads * D, in]``; ``num_heads`` is the query head
    count for Q and the KV head count for K."""
    rows, cols = w.shape
    d = rows // num_heads
    # GGUF row 2i+j of a head is HF row i + j*D/2: [heads, D/2, 2] -> [heads, 2, D/2].
    return w.reshape(num_heads, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def permute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """What ``convert_hf_to_gguf.py`` does to Q and K (the inverse of :func:`unpermute_qk`);
    used by the tests and by the HF writer's round trip."""
    rows, cols = w.shape
    d = rows // num_heads
    return w.reshape(num_heads, 2, d // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def to_in_out(w: np.ndarray) -> np.ndarray:
    """``[out, in]`` (checkpoint order) -> contiguous ``[in, out]``, so ``y = x @ w`` streams
    the matrix row by row."""
    return np.ascontiguousarray(w.T)


# ---------------------------------------------------------------------------
# Metadata.
# ---------------------------------------------------------------------------
def _field(reader, key: str, default=None, required: bool = True):
    f = reader.fields.get(key)
    if f is None:
        if required and default is None:
            raise ModelLoadError(f"GGUF metadata: missing {key!r}; the file is incomplete or "
                                 "not a Llama model, convert it again with convert_hf_to_gguf.py")
        return default
    return f.contents()


def config_from_gguf(reader, tensor_names: set) -> ModelConfig:
    """A :class:`ModelConfig` from a GGUF's ``{arch}.*`` metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}: Llama-style models such as SmolLM2, "
            "TinyLlama, Llama 2/3)")
    num_heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens", required=False)
    vocab = _field(reader, f"{arch}.vocab_size", default=len(tokens) if tokens else None)
    window = _field(reader, f"{arch}.attention.sliding_window", required=False)
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(_field(reader, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", default=num_heads)),
        # key_length when the converter wrote it (head_dim != hidden / heads), else the
        # RoPE width (all of a Llama head is rotated), else hidden / heads.
        head_dim=int(_field(reader, f"{arch}.attention.key_length", required=False)
                     or _field(reader, f"{arch}.rope.dimension_count", required=False)
                     or hidden // num_heads),
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", default=10000.0)),
        # float32 in the file: 1e-5 is stored as 9.99999974e-06; round back to what it meant.
        rms_norm_eps=float(np.format_float_positional(np.float32(
            _field(reader, f"{arch}.attention.layer_norm_rms_epsilon", default=1e-5)))),
        sliding_window=int(window) if window else None,
        tie_word_embeddings="output.weight" not in tensor_names,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", default=2048)),
        architecture=architecture_for(arch, "gguf"),
    )


def tokenizer_from_gguf(reader) -> Tokenizer:
    """The :class:`Tokenizer` stored in a GGUF's ``tokenizer.*`` fields."""
    def get(key, default=None, required=True):
        return _field(reader, "tokenizer." + key, default=default, required=required)

    return Tokenizer.from_gguf_fields(
        tokens=get("ggml.tokens"),
        token_types=get("ggml.token_type"),
        merges=get("ggml.merges"),
        model=get("ggml.model"),
        pre=get("ggml.pre", default="default"),
        eos_token_id=int(get("ggml.eos_token_id")),
        bos_token_id=get("ggml.bos_token_id", required=False),
        add_bos_token=bool(get("ggml.add_bos_token", default=False, required=False)),
        chat_template=get("chat_template", required=False),
    )


# ---------------------------------------------------------------------------
# The loader.
# ---------------------------------------------------------------------------
def load_gguf(path, quantization="gguf") -> tuple[ModelConfig, dict, Tokenizer]:
    """Read a Llama GGUF file: ``(config, {our_name: float32 array}, tokenizer)``.

    With ``quantization="gguf"`` the projections and the embedding keep the
    file's blocks instead, as :class:`~paged_np.quant.QuantMatrix` values
    (the layout of :mod:`paged_np.models.quantized`); ``None`` dequantizes
    everything to float32.

    Projections come out ``[in, out]`` and stacked over layers
    (``wq`` is ``[num_layers, hidden, heads * head_dim]``), Q and K rows in
    transformers' order. The file is closed (its memory map released) before
    returning.
    """
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file; pass the path of a .gguf file, or a known "
                             "name such as 'smollm2-135m-instruct'")
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:                                       # bad magic, truncated, ...
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e}); download it again") from e
    try:
        tensors = {t.name: t for t in reader.tensors}
        cfg = config_from_gguf(reader, set(tensors))
        tokenizer = tokenizer_from_gguf(reader)
        weights = (_read_quantized(tensors, cfg) if quantization == "gguf"
                   else _read_weights(tensors, cfg))
    finally:
        del reader, tensors                                      # drop the memory map
        gc.collect()
    return cfg, weights, tokenizer


def _read_weights(tensors: dict, cfg: ModelConfig) -> dict:
    from .llama import weight_shapes

    shapes = weight_shapes(cfg)
    weights = {name: np.empty(shape, dtype=np.float32) for name, shape in shapes.items()}
    seen = set()
    for gname, t in tensors.items():
        m = _LAYER.match(gname)
        layer, key = (int(m.group(1)), m.group(2)) if m else (None, gname)
        ours = GGUF_NAMES.get(key)
        if ours is None or ours not in weights:
            if key.startswith("rope_freqs") or key == "output.weight":
                continue                                         # tied head / llama3 scaling
            raise ModelLoadError(f"{gname}: unexpected tensor for a Llama model")
        w = dequantize(t.data, t.tensor_type.name, gname)        # [out, in] or [n]
        if ours in ("wq", "wk"):
            w = unpermute_qk(w, cfg.num_heads if ours == "wq" else cfg.num_kv_heads)
        if w.ndim == 2 and ours != "embed":
            w = to_in_out(w)                                     # [in, out]
        target = weights[ours] if layer is None else weights[ours][layer]
        if w.shape != target.shape:
            raise ModelLoadError(f"{gname}: shape {w.shape} does not fit {ours} "
                                 f"{target.shape} of the config")
        target[...] = w
        seen.add((ours, layer))
    expected = {(n, None) for n in ("embed", "final_norm", "lm_head") if n in weights}
    expected |= {(n, i) for n in shapes if n not in ("embed", "final_norm", "lm_head")
                 for i in range(cfg.num_layers)}
    missing = sorted(expected - seen, key=str)
    if missing:
        raise ModelLoadError(f"GGUF: missing tensors for {missing[:4]}"
                             f"{' ...' if len(missing) > 4 else ''}")
    return weights


def _read_quantized(tensors: dict, cfg: ModelConfig) -> dict:
    """The file's blocks as QuantMatrix values (norms float32); Q/K rows unpermuted."""
    from ..quant import QUANT_FORMATS, QuantMatrix, parse_blocks
    from .llama import weight_shapes

    shapes = weight_shapes(cfg)
    seen = set()
    out: dict = {n: [None] * cfg.num_layers for n in shapes if n.startswith("w")}
    out.update({n: np.zeros(shapes[n], np.float32) for n in ("attn_norm", "mlp_norm")})
    for gname, t in tensors.items():
        m = _LAYER.match(gname)
        layer, key = (int(m.group(1)), m.group(2)) if m else (None, gname)
        ours = GGUF_NAMES.get(key)
        if ours is None or ours not in shapes:
            if key.startswith("rope_freqs") or key == "output.weight":
                continue
            raise ModelLoadError(f"{gname}: unexpected tensor for a Llama model")
        fmt = t.tensor_type.name
        if ours.endswith("norm"):
            value = dequantize(t.data, fmt, gname)
        else:
            rows, cols = (int(n) for n in reversed(t.shape))    # ggml order -> [out, in]
            heads = {"wq": cfg.num_heads, "wk": cfg.num_kv_heads}.get(ours)
            if fmt in QUANT_FORMATS:
                q, d, mn = parse_blocks(t.data, fmt, rows, cols)
                if heads:                                        # the permutation trap, on rows
                    q = unpermute_qk(q.reshape(rows, -1), heads).reshape(q.shape)
                    d, mn = unpermute_qk(d, heads), unpermute_qk(mn, heads)
                value = QuantMatrix.from_blocks(fmt, q, d, mn)   # [in, out] as a matrix
            else:                                                # F32, F16, Q5_x: float32
                w = dequantize(t.data, fmt, gname)
                value = QuantMatrix.dense(to_in_out(unpermute_qk(w, heads) if heads else w))
        if layer is None:
            out[ours] = value
        else:
            out[ours][layer] = value
            seen.add((ours, layer))
    missing = [n for n in shapes if n not in out
               or (n in ("attn_norm", "mlp_norm") or isinstance(out[n], list))
               and len({i for o, i in seen if o == n}) != cfg.num_layers]
    if missing:
        raise ModelLoadError(f"GGUF: missing tensors for {missing[:4]}")
    return out


def check_dtype(dtype) -> None:
    """Only float32 compute is implemented; say so clearly for anything else."""
    if np.dtype(dtype) != np.float32:
        raise InvalidArgument(f"dtype: only float32 is supported, got {np.dtype(dtype)}")
