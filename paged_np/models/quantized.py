"""How :class:`~paged_np.LlamaModel` holds quantized weights (:mod:`paged_np.quant`).

A quantized weights dict has the float dict's names; the difference is the
values:

- each projection (``wq`` ... ``w_down``) is a list of ``num_layers``
  :class:`~paged_np.quant.QuantMatrix`, each ``[in, out]``;
- ``embed`` is one QuantMatrix whose *rows* are the vocabulary (shape
  ``(hidden, vocab)``): ``embed[ids]`` looks rows up, and ``h @ embed`` is
  the tied LM head (``lm_head``, when untied, is another ``(hidden, vocab)``);
- the norms stay float32 arrays.

:func:`quantize_weights` turns a float dict into this (``quantization="q8_0"``:
llama.cpp's converter rule, block by block); :mod:`paged_np.models.gguf`
builds it straight from the file's blocks (``quantization="gguf"``).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument, ShapeError
from ..quant import BLOCK, QuantMatrix
from ..registry import WEIGHT_QUANTIZATIONS

#: Values of ``quantization`` that :func:`paged_np.load_model` and :class:`paged_np.LLM` take:
#: the names of :data:`paged_np.registry.WEIGHT_QUANTIZATIONS`, with None for "none" (float32).
QUANTIZATIONS = tuple(None if q == "none" else q for q in WEIGHT_QUANTIZATIONS)

PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def check_quantization(quantization) -> None:
    """Raise InvalidArgument unless ``quantization`` is one of :data:`QUANTIZATIONS`."""
    if quantization not in QUANTIZATIONS:
        raise InvalidArgument(f"quantization must be one of {QUANTIZATIONS}, "
                              f"got {quantization!r}")


def is_quantized(weights: dict) -> bool:
    """True when ``weights`` holds QuantMatrix values (the layout of this module)."""
    return isinstance(weights.get("embed"), QuantMatrix)


def quantize_weights(weights: dict) -> dict:
    """Float32 weights (the names of ``weight_shapes``) -> Q8_0 QuantMatrix values."""
    out = {}
    for name, w in weights.items():
        if name.endswith("norm"):
            out[name] = np.asarray(w, dtype=np.float32)
            continue
        w = np.asarray(w, dtype=np.float32)
        k = w.shape[-1] if name == "embed" else w.shape[-2]
        if k % BLOCK:
            raise InvalidArgument(f"quantization='q8_0': {name} has {k} inputs per row, not a "
                                  f"multiple of the {BLOCK}-weight block; use quantization=None")
        if name == "embed":
            out[name] = QuantMatrix.from_float(w.T)              # rows = vocabulary
        elif name == "lm_head":
            out[name] = QuantMatrix.from_float(w)
        else:
            out[name] = [QuantMatrix.from_float(wi) for wi in w]
    return out


def with_int8_activations(weights: dict) -> dict:
    """Quantized weights -> the same blocks multiplied with int8 inputs
    (:mod:`paged_np.quant.int8`; ``quantization="gguf_a8"``). Float values stay."""
    def convert(w):
        if isinstance(w, list):
            return [convert(m) for m in w]
        return w.with_int8_activations() if isinstance(w, QuantMatrix) else w
    return {name: convert(w) for name, w in weights.items()}


def check_quantized(shapes: dict, weights: dict) -> None:
    """Every value fits its ``weight_shapes`` entry (a list of L for projections)."""
    for name, shape in shapes.items():
        w = weights[name]
        if name.endswith("norm"):
            got = np.shape(w)
        elif name == "embed":
            got = (w.shape[1], w.shape[0]) if isinstance(w, QuantMatrix) else None
        elif name == "lm_head":
            got = w.shape if isinstance(w, QuantMatrix) else None
        else:
            ok = isinstance(w, (list, tuple)) and all(isinstance(m, QuantMatrix) for m in w)
            got = (len(w), *w[0].shape) if ok and len(w) else None
        if got != shape:
            raise ShapeError(f"weights[{name!r}] must have shape {shape} (as QuantMatrix "
                             f"values when quantized), got {got}")


def fuse(*layers) -> list:
    """Per layer, one QuantMatrix whose outputs are the parts' outputs side by side."""
    return [QuantMatrix.concat(parts) for parts in zip(*layers)]


def weight_bytes(w: dict, tied: bool) -> int:
    """Bytes of weight memory in a model's ``w`` dict (lists summed, tied head once)."""
    total = 0
    for name, a in w.items():
        if name == "lm_head" and tied:
            continue
        total += sum(m.nbytes for m in a) if isinstance(a, list) else a.nbytes
    return total
