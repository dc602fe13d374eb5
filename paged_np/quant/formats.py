"""The weight formats, named once: GGUF's block formats and the two kinds of codes.

Two tables, read by everything else (nothing here imports NumPy or Numba). The
values of ``quantization=`` are a choice like any other, in
:data:`paged_np.registry.WEIGHT_QUANTIZATIONS`.

- :data:`BLOCK_FORMATS`: the GGUF tensor types kept quantized in memory, what a
  32-weight block holds and which :data:`kind <Q4>` of codes the kernels read;
- :data:`FLOAT_FORMATS`: the tensor types kept as float32 arrays.

The kernels see a format only as its *kind*, an integer, because Numba compiles
integers, not strings: :data:`Q4` (two 4-bit codes a byte, ``w = d q + m``:
Q4_0 and Q4_1, Q4_0 read with ``m = -8 d``) or :data:`Q8` (one signed byte a
code, ``w = d q``: Q8_0). A third format with one of these shapes of codes is one
row in :data:`BLOCK_FORMATS`; one with another shape is a new kind and a new
branch in the kernels.
"""

from __future__ import annotations

from typing import NamedTuple

#: Kind of codes: two 4-bit codes in a byte, a float scale and minimum a block.
Q4 = 0
#: Kind of codes: one signed byte a code, a float scale a block (no minimum).
Q8 = 1
#: The kinds by name (for messages and reprs).
KINDS = {Q4: "Q4", Q8: "Q8"}


class BlockFormat(NamedTuple):
    """A GGUF block format: ``bytes`` per block of 32 weights in the file, the ``kind``
    of codes the kernels read, and how a weight comes back from its code ``q``."""

    bytes: int
    kind: int
    weight: str


#: GGUF's quantized tensor types that stay quantized in memory.
BLOCK_FORMATS = {
    "Q8_0": BlockFormat(34, Q8, "d * q,  q -128..127"),
    "Q4_0": BlockFormat(18, Q4, "d * (q - 8),  q 0..15"),
    "Q4_1": BlockFormat(20, Q4, "d * q + m,  q 0..15"),
}
#: Bytes per block of each quantized format (the same table, as :mod:`.blocks` reads it).
QUANT_FORMATS = {name: f.bytes for name, f in BLOCK_FORMATS.items()}
#: Tensor types kept as float32 arrays (F16 is widened once, on load).
FLOAT_FORMATS = ("F32", "F16")
#: Every tensor type a :class:`~paged_np.quant.QuantMatrix` holds.
FORMATS = tuple(BLOCK_FORMATS) + FLOAT_FORMATS


def kind_of(fmt: str) -> int:
    """The kind of codes (:data:`Q4` or :data:`Q8`) of a block format's name."""
    return BLOCK_FORMATS[fmt].kind
