"""QuantMatrix: one projection's weights kept as the GGUF file's blocks, multiplied in Numba.

A :class:`QuantMatrix` stands where the float model has an ``[in, out]``
float32 array ``w`` and is used the same way: ``y = x @ qm`` with ``x``
float32 ``[T, in]`` gives ``[T, out]`` (NumPy hands ``@`` to
:meth:`__rmatmul__` because ``__array_ufunc__`` is None). So the model's code
does not change; only the bytes each token reads do (Q4_1: 0.75 bytes a
weight in memory here, 4 as float32).

It holds the weights repacked once from the file's blocks into one of the two
layouts of :mod:`.layouts` (each drawn there), chosen by the inputs it will be
multiplied by:

=====================  ==============================================  ===============
layout                 shape of the codes                              multiplied by
=====================  ==============================================  ===============
``GroupedBlocks``      ``[G, nb, J, 64]``: 64 rows side by side        :mod:`.kernels`
``Dot4Blocks``         ``[C, nb, Q, 16, 4]``: 4 codes of a row         :mod:`.int8`
                       side by side, 16 rows
=====================  ==============================================  ===============

The row count is padded to a whole group (chunk) with zero rows that the
result never shows. The scales are widened from float16 to float32 at load
(Q4_1: 24 bytes per 32 weights here, 20 in the file), so the kernels do no
float16 conversion.

Which kernel runs depends on the number of input rows ``T``:

========  ===================================================================
1..3      ``rows``: decode (T = 1), a few decodes; the codes converted in
          registers as they are multiplied, each conversion feeding all the
          rows (no tile to write)
>= 4      ``batch``: a batch of decodes, a speculative verify step, prefill;
          each block's codes converted once (by its first pass, into a
          float32 tile in L1) and multiplied into 16 rows at a time, 3-5 rows
          per pass
========  ===================================================================

Both compute each row with the same operations in the same order, so a row
gets the same bits alone or among others (:mod:`.kernels`): greedy
speculative decoding scores a draft exactly as decoding would.

Both are Numba kernels on Numba's threads. Dequantizing panels for BLAS
(the float32 path's product) is a little faster alone at 64 rows and more,
but was twice as slow inside the model: Numba's and OpenBLAS's threads each
spin for a while after their call and take the other's core
(``docs/design.md``, "No BLAS in the quantized model").

With ``int8_activations`` (``quantization="gguf_a8"``,
:meth:`QuantMatrix.with_int8_activations`) the same blocks are held as
``Dot4Blocks`` and every ``T`` goes to ``int8.matmul``: the input is quantized
to int8 and the products are integer dot products (:mod:`.simd`).

``F32`` and ``F16`` tensors are held as a float32 ``[in, out]`` array and
multiplied by BLAS (same interface).
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import DTypeError, IndexOutOfRange, ShapeError
from ..forks import serial
from . import int8 as I8
from . import kernels as K
from .blocks import BLOCK, dequantize_blocks
from .formats import FLOAT_FORMATS, QUANT_FORMATS, kind_of
from .layouts import Dot4Blocks, GroupedBlocks

#: Largest input row count that uses the ``rows`` kernel (from 4 rows: ``batch``).
FEW_ROWS = 3


class QuantMatrix:
    """An ``[in, out]`` weight kept quantized; ``x @ qm`` multiplies by it.

    Build with :meth:`from_blocks` (the file's ``(q, d, m)``, rows = outputs),
    :meth:`from_float` (quantize a float matrix on load) or :meth:`dense`
    (F32/F16 kept as float32). ``packed`` is the kernels' record
    (:class:`.layouts.GroupedBlocks` or :class:`.layouts.Dot4Blocks`; None when
    dense).
    """

    __array_ufunc__ = None                                       # ndarray @ qm -> __rmatmul__

    def __init__(self, fmt: str, shape: tuple, packed=None, dense=None):
        self.fmt, self.shape = fmt, (int(shape[0]), int(shape[1]))   # (in, out)
        self.packed, self._dense = packed, dense

    @property
    def int8_activations(self) -> bool:
        """True: held as :class:`.layouts.Dot4Blocks`, ``x @ self`` quantizes ``x`` to int8."""
        return isinstance(self.packed, Dot4Blocks)

    # ----------------------------------------------------------------- building
    @classmethod
    def from_blocks(cls, fmt: str, q: np.ndarray, d: np.ndarray, m: np.ndarray,
                    int8_activations: bool = False) -> QuantMatrix:
        """Repack ``q`` ``[out, nb, 32]``, ``d`` and ``m`` ``[out, nb]`` (from
        :func:`~paged_np.quant.blocks.parse_blocks`) into the float kernels' layout
        (``int8_activations``: the int8 kernel's, multiplied with int8 inputs)."""
        if fmt not in QUANT_FORMATS:
            raise DTypeError(f"fmt must be one of {tuple(QUANT_FORMATS)}, got {fmt!r}")
        if q.ndim != 3 or q.shape[2] != BLOCK or d.shape != q.shape[:2] or m.shape != d.shape:
            raise ShapeError(f"q must be [out, nb, {BLOCK}] and d, m [out, nb]; got "
                             f"{q.shape}, {d.shape}, {m.shape}")
        layout = Dot4Blocks if int8_activations else GroupedBlocks
        out, nb = d.shape
        return cls(fmt, (nb * BLOCK, out), layout.pack(kind_of(fmt), q, d, m))

    @classmethod
    def from_float(cls, w_in_out: np.ndarray, fmt: str = "Q8_0") -> QuantMatrix:
        """Quantize a float ``[in, out]`` matrix (``in`` a multiple of 32) to Q8_0 on load."""
        from .blocks import quantize_q8_0

        if fmt != "Q8_0":
            raise DTypeError(f"fmt: only Q8_0 quantizes a float matrix here, got {fmt!r}")
        w = np.asarray(w_in_out, dtype=np.float32)
        if w.ndim != 2:
            raise ShapeError(f"w_in_out must be 2-D [in, out], got shape {w.shape}")
        return cls.from_blocks("Q8_0", *quantize_q8_0(w.T))

    @classmethod
    def dense(cls, w_in_out: np.ndarray, fmt: str = "F32") -> QuantMatrix:
        """An F32/F16 tensor kept as float32 ``[in, out]`` (multiplied by BLAS)."""
        if fmt not in FLOAT_FORMATS:
            raise DTypeError(f"fmt must be one of {FLOAT_FORMATS}, got {fmt!r}")
        w = np.ascontiguousarray(w_in_out, dtype=np.float32)
        if w.ndim != 2:
            raise ShapeError(f"w_in_out must be 2-D [in, out], got shape {w.shape}")
        return cls(fmt, w.shape, dense=w)

    def blocks(self):
        """Back to the file's order: ``(q [out, nb, 32], d, m [out, nb])`` (quantized formats)."""
        if self._dense is not None:
            raise DTypeError(f"blocks: a {self.fmt} matrix has no quantized blocks")
        return self.packed.unpack(self.shape[1])

    @staticmethod
    def concat(parts) -> QuantMatrix:
        """Fuse matrices that share ``in`` along ``out`` (q, k and v into one product).
        Mixed formats fall back to float32 (no SmolLM2 file needs it)."""
        fmts = {p.fmt for p in parts}
        if len({p.shape[0] for p in parts}) != 1:
            raise ShapeError(f"concat: inputs differ: {[p.shape for p in parts]}")
        if len(fmts) == 1 and parts[0].fmt in QUANT_FORMATS:
            q, d, m = zip(*(p.blocks() for p in parts))
            return QuantMatrix.from_blocks(parts[0].fmt, np.concatenate(q), np.concatenate(d),
                                           np.concatenate(m), parts[0].int8_activations)
        return QuantMatrix.dense(np.concatenate([p.dequantize() for p in parts], axis=1))

    # --------------------------------------------------------------- reading
    @property
    def size(self) -> int:
        """Number of weights (``in * out``)."""
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (quantized values, scales, padding)."""
        if self._dense is not None:
            return self._dense.nbytes
        p = self.packed
        return p.codes.nbytes + p.scales.nbytes + p.mins.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 ``[in, out]``: the reference every kernel is checked against."""
        if self._dense is not None:
            return self._dense
        return np.ascontiguousarray(dequantize_blocks(*self.blocks()).T)

    def __array__(self, dtype=None, copy=None):
        w = self.dequantize()
        return w if dtype is None else w.astype(dtype)

    def __repr__(self) -> str:
        a8 = ", int8 activations" if self.int8_activations else ""
        return f"QuantMatrix({self.fmt}, in={self.shape[0]}, out={self.shape[1]}{a8})"

    def with_int8_activations(self) -> QuantMatrix:
        """The same blocks held as :class:`.layouts.Dot4Blocks` (inputs quantized to int8
        when multiplied); float32 (F32/F16) matrices come back unchanged."""
        if self._dense is not None or self.int8_activations:
            return self
        return QuantMatrix.from_blocks(self.fmt, *self.blocks(), int8_activations=True)

    # --------------------------------------------------------------- multiply
    def __rmatmul__(self, x) -> np.ndarray:
        return self.matmul(x)

    def matmul(self, x) -> np.ndarray:
        """``x`` float32 ``[T, in]`` -> float32 ``[T, out]``, the kernel chosen by ``T``."""
        x = _check_x(x, self.shape[0])
        if self._dense is not None:
            return x @ self._dense
        T, out, w = x.shape[0], self.shape[1], self.packed
        if T == 0:
            return np.zeros((0, out), np.float32)
        y = np.empty((T, w.padded_rows), np.float32)            # [T, out + padding]
        if isinstance(w, Dot4Blocks):
            serial(I8.matmul)(w, x, y)                           # serial: in a forked child
        elif T > FEW_ROWS:
            serial(K.batch)(w, K.inputs(x, w.kind), y, numba.get_num_threads())
        else:
            serial(K.rows)(w, K.inputs(x, w.kind), y)
        return y if y.shape[1] == out else np.ascontiguousarray(y[:, :out])

    def __getitem__(self, ids) -> np.ndarray:
        """Embedding lookup: ``qm[ids]`` -> float32 ``[T, in]``, rows ``ids`` of the
        ``[out, in]`` matrix (the tied embedding read as a table, no float32 copy)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.shape[1]):
            raise IndexOutOfRange(f"ids: row outside [0, {self.shape[1]})")
        if self._dense is not None:
            return self._dense.T[ids]
        out = np.empty((ids.size, self.shape[0]), np.float32)
        (I8.embed if self.int8_activations else K.embed)(self.packed, ids, out)
        return out


def _check_x(x, k: int) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise DTypeError(f"x must be a numpy array, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise DTypeError(f"x must be float32, got {x.dtype}")
    if x.ndim != 2 or x.shape[1] != k:
        raise ShapeError(f"x must be [T, {k}], got shape {x.shape}")
    return np.ascontiguousarray(x)
