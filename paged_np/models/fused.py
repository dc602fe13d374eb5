"""The small per-layer operations of a step, each fused into one Numba call.

At batch 1 a layer's matrix products take tens of microseconds each, and
the NumPy around them (RMSNorm is 7 array operations, RoPE on q and k about
20, SiLU-times-up 4) costs a few microseconds per operation: a millisecond or
more per 30-layer step, 10-20% of a quantized decode step. Each function here
does the same arithmetic as its NumPy twin in :mod:`paged_np.models.llama`
(``rms_norm``, ``apply_rope``, ``silu``: the references the tests compare
with) in one compiled call.

Inputs are the model's own arrays (float32, C order, shapes fixed by the
config); the public functions check shapes and dtypes before the jitted code
runs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..attention.numba_kernels import LOG2E, exp2
from ..config import JIT_OPTIONS
from ..errors import DTypeError, ShapeError


@njit(**JIT_OPTIONS)
def _rms_norm(x, w, eps, out):
    T, H = x.shape
    for t in range(T):
        s = np.float32(0.0)
        for h in range(H):
            s += x[t, h] * x[t, h]
        inv = np.float32(1.0) / np.sqrt(s / np.float32(H) + eps)
        for h in range(H):
            out[t, h] = x[t, h] * inv * w[h]


@njit(**JIT_OPTIONS)
def _rope_qk(qkv, cos, sin, nq, nkv, D, q, k):
    T = qkv.shape[0]
    half = D // 2
    for t in range(T):
        for h in range(nq + nkv):
            src = h * D                                          # q heads, then k heads
            for i in range(half):
                x1 = qkv[t, src + i]
                x2 = qkv[t, src + half + i]
                c, s = cos[t, i], sin[t, i]
                if h < nq:
                    q[t, h, i] = x1 * c - x2 * s
                    q[t, h, half + i] = x2 * c + x1 * s
                else:
                    k[t, h - nq, i] = x1 * c - x2 * s
                    k[t, h - nq, half + i] = x2 * c + x1 * s


@njit(error_model="numpy", **JIT_OPTIONS)
def _silu_mul(gate_up, inter, out):
    # sigmoid(g) from e = exp(-|g|) <= 1: 1 / (1 + e) for g >= 0, e / (1 + e) below, with
    # the polynomial exp2 in a loop of its own: that loop vectorises, and so does the
    # rest (np.exp, a scalar call each, made this 3.4x slower: 1 ms of a 9-row step).
    # error_model="numpy": Python's model tests every division for a zero divisor (to
    # raise ZeroDivisionError), and that branch kept the second loop scalar (1 + e >= 1
    # is never 0): 2.2x slower at 9 rows.
    T = gate_up.shape[0]
    for t in range(T):
        g, u, o = gate_up[t, :inter], gate_up[t, inter:], out[t]
        for i in range(inter):
            o[i] = exp2(min(g[i], -g[i]) * LOG2E)                 # e = exp(-|g|)
        for i in range(inter):
            e = o[i]
            o[i] = g[i] * u[i] * max(e, np.float32(g[i] >= 0)) / (np.float32(1.0) + e)


def _f32_2d(name: str, a) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 2:
        raise DTypeError(f"{name} must be a float32 2-D array, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} {np.shape(a)}")
    return np.ascontiguousarray(a)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / rms(x) * weight``: float32 [T, H] -> [T, H] (one call)."""
    x = _f32_2d("x", x)
    if weight.shape != (x.shape[1],) or weight.dtype != np.float32:
        raise ShapeError(f"weight must be float32 [{x.shape[1]}], got {weight.dtype} "
                         f"{weight.shape}")
    out = np.empty_like(x)
    _rms_norm(x, weight, np.float32(eps), out)
    return out


def rope_qk(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, num_heads: int,
            num_kv_heads: int, head_dim: int):
    """The fused QKV product's output ``[T, (Hq + 2 Hkv) D]`` -> RoPE'd q ``[T, Hq, D]``,
    RoPE'd k ``[T, Hkv, D]`` and v ``[T, Hkv, D]`` (a view), in one call."""
    qkv = _f32_2d("qkv", qkv)
    T = qkv.shape[0]
    if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ShapeError(f"qkv must be [T, {(num_heads + 2 * num_kv_heads) * head_dim}], got "
                         f"{qkv.shape}")
    if cos.shape != (T, head_dim // 2) or sin.shape != cos.shape:
        raise ShapeError(f"cos and sin must be [{T}, {head_dim // 2}], got {cos.shape}, "
                         f"{sin.shape}")
    q = np.empty((T, num_heads, head_dim), np.float32)
    k = np.empty((T, num_kv_heads, head_dim), np.float32)
    _rope_qk(qkv, np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32),
             num_heads, num_kv_heads, head_dim, q, k)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:].reshape(T, num_kv_heads, head_dim)
    return q, k, v


def silu_mul(gate_up: np.ndarray, inter: int) -> np.ndarray:
    """``silu(gate) * up`` from the fused ``[T, 2I]`` product: -> float32 [T, I]."""
    gate_up = _f32_2d("gate_up", gate_up)
    if gate_up.shape[1] != 2 * inter:
        raise ShapeError(f"gate_up must be [T, {2 * inter}], got {gate_up.shape}")
    out = np.empty((gate_up.shape[0], inter), np.float32)
    _silu_mul(gate_up, inter, out)
    return out
