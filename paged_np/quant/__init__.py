"""Quantized weights: the GGUF file's blocks kept in memory and multiplied in Numba.

- :mod:`.formats`: the formats named once (GGUF block types, the kinds of
  codes :data:`Q4` and :data:`Q8`, the ``quantization=`` choices).
- :mod:`.blocks`: the block formats read the obvious way in NumPy: raw bytes
  -> ``q [out, nb, 32]``, ``d, m [out, nb]`` -> ``w = d * q + m``. The reference.
- :mod:`.layouts`: the two layouts the blocks are repacked into on load, drawn:
  rows side by side, so SIMD lanes run across output rows.
- :mod:`.kernels` (with :mod:`.passes`): the Numba kernels for float32 inputs;
  :mod:`.int8`: for int8 inputs; :mod:`.simd`: the vector words they use.
- :mod:`.matrix`: :class:`QuantMatrix`, which stands where the float model has
  an ``[in, out]`` array: ``x @ qm`` picks the kernel by the number of rows.

Why: decode reads every weight once per token, so its speed is bytes per
token. SmolLM2-135M is 513 MiB as float32 and 96 MB in its Q4_1 file.
"""

from .blocks import (
                     BLOCK,
                     dequantize_blocks,
                     dequantize_raw,
                     parse_blocks,
                     quantize_q8_0,
)
from .formats import (
                      BLOCK_FORMATS,
                      FLOAT_FORMATS,
                      FORMATS,
                      Q4,
                      Q8,
                      QUANT_FORMATS,
)
from .matrix import FEW_ROWS, QuantMatrix

__all__ = ["BLOCK", "BLOCK_FORMATS", "FEW_ROWS", "FLOAT_FORMATS", "FORMATS", "Q4", "Q8",
           "QUANT_FORMATS", "QuantMatrix", "dequantize_blocks",
           "dequantize_raw", "parse_blocks", "quantize_q8_0"]
