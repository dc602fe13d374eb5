"""Quantized weights: the GGUF file's blocks kept in memory and multiplied in Numba.

- :mod:`.blocks`: the block formats (Q8_0, Q4_0, Q4_1) read the obvious way in
  NumPy: raw bytes -> ``(q, d, m)`` -> ``w = d * q + m``. The reference.
- :mod:`.kernels`: the Numba kernels over a layout repacked once at load
  (32 output rows side by side per block, so SIMD lanes run across rows).
- :mod:`.matrix`: :class:`QuantMatrix`, which stands where the float model has
  an ``[in, out]`` array: ``x @ qm`` picks the kernel by the number of rows.

Why: decode reads every weight once per token, so its speed is bytes per
token. SmolLM2-135M is 513 MiB as float32 and 96 MB in its Q4_1 file.
"""

from .blocks import (
                     BLOCK,
                     FLOAT_FORMATS,
                     FORMATS,
                     QUANT_FORMATS,
                     dequantize_blocks,
                     dequantize_raw,
                     parse_blocks,
                     quantize_q8_0,
)
from .matrix import FEW_ROWS, QuantMatrix

__all__ = ["BLOCK", "FEW_ROWS", "FLOAT_FORMATS", "FORMATS", "QUANT_FORMATS", "QuantMatrix",
           "dequantize_blocks", "dequantize_raw", "parse_blocks", "quantize_q8_0"]
