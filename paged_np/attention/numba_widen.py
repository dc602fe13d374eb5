"""Widening a page element to float32 as a kernel reads it: float16, int8 and fp8.

:func:`to_f32` is called on every K and V element the Numba kernels read
(:mod:`paged_np.attention.numba_kernels`); at compile time it becomes the one
conversion the page's dtype needs:

==========  =======================================================
page dtype  what ``to_f32(x)`` compiles to
==========  =======================================================
float32     nothing (``x`` itself)
uint16      float16 bits (Numba has no float16 arrays on the CPU):
            one ``vcvtph2ps`` per 8 or 16 values with F16C, integer
            operations without (:func:`target_widens_half` asks LLVM)
int8        the int8 code of ``kv_cache_dtype="int8"``, converted
uint8       an fp8 e4m3 code, by bit operations (:func:`fp8_bits_to_f32`):
            a shift into float32's bit positions and one multiply
==========  =======================================================

The scale of an 8-bit row is applied elsewhere, once per score and per weight
(:func:`paged_np.attention.numba_kernels.online_softmax_scaled`).
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ..cache.kv_quant import FP8_E4M3
from ..config import JIT_OPTIONS


# ---------------------------------------------------------------------------
# float16 -> float32, an LLVM instruction Numba does not expose: a plain-Python
# twin (for NUMBA_DISABLE_JIT=1) and an @overload that emits the instruction.
# ---------------------------------------------------------------------------
def half_to_f32(h):
    """The float16 whose bits are the uint16 ``h``, as a float32 (exact)."""
    return np.float32(np.uint16(h).view(np.float16))


@intrinsic
def _fpext_half(typingctx, h):
    """LLVM: ``fpext (bitcast i16 h to half) to float``."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


#: The library routines LLVM calls to widen a half without F16C (new name, LLVM <= 14's).
_HALF_LIBCALLS = ("__extendhfsf2", "__gnu_h2f_ieee")

_FPEXT_PROBE = """
define float @widen(i16 %h) {
  %x = bitcast i16 %h to half
  %y = fpext half %x to float
  ret float %y
}
"""


@functools.cache
def target_widens_half() -> bool:
    """Whether the CPU Numba compiles for widens float16 in one instruction (F16C).

    Without F16C (``NUMBA_CPU_NAME=generic``, old CPUs) LLVM lowers ``fpext
    half`` to a call of a compiler-rt routine (``__extendhfsf2``; LLVM 14, under
    llvmlite 0.42, names it ``__gnu_h2f_ieee``) that Numba's JIT does not link:
    the process would abort at the first float16 page. So the question is put
    to LLVM itself, once: compile a one-line widening for the target and look
    for either call.
    """
    from numba.core.registry import cpu_target

    tm = cpu_target.target_context.codegen()._tm  # the target machine Numba compiles for
    module = llvm.parse_assembly(_FPEXT_PROBE)
    module.triple = tm.triple
    asm = tm.emit_assembly(module)
    return not any(name in asm for name in _HALF_LIBCALLS)


@njit(**JIT_OPTIONS)
def _half_bits_to_f32(h):
    """float16 bits to float32 with integer operations: the fallback without F16C."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    mant = h & np.uint32(0x3FF)
    if exp == 0:  # zero or subnormal: mant * 2**-24, exact in float32
        f = np.float32(mant) * np.float32(2.0**-24)
        return -f if sign else f
    if exp == 31:  # inf or nan
        bits = sign | np.uint32(0x7F800000) | (mant << np.uint32(13))
    else:  # rebias the exponent from 15 to 127
        bits = sign | ((exp + np.uint32(112)) << np.uint32(23)) | (mant << np.uint32(13))
    return np.uint32(bits).view(np.float32)


def _widen_impl():
    """The jitted widening of float16 bits the target can run (argument named ``x``)."""
    if target_widens_half():
        return lambda x: _fpext_half(x)
    return lambda x: _half_bits_to_f32(x)


@overload(half_to_f32, jit_options=JIT_OPTIONS)
def _half_to_f32_jit(h):
    if target_widens_half():
        return lambda h: _fpext_half(h)
    return lambda h: _half_bits_to_f32(h)


#: 2**120: moves an e4m3 exponent (bias 7) placed in float32's bits (bias 127) back.
_FP8_REBIAS = np.float32(2.0**120)


@njit(**JIT_OPTIONS)
def fp8_bits_to_f32(b):
    """An fp8 e4m3 code (uint8) as float32, by bit operations (equal to the table).

    The code's 4 exponent and 3 mantissa bits, shifted left by 20, land in
    float32's exponent and mantissa fields: as a float32 that is the e4m3
    value times ``2**(7 - 127)`` (the exponent biases differ by 120), also for
    e4m3's subnormals, which become float32 subnormals. One multiply by
    ``2**120`` undoes it, and the sign bit moves to bit 31. No branch and no
    table: LLVM vectorises it (the table lookup, a gather, measured 3.7x
    slower at context 8192). ``0x7F`` (NaN) would read 480; it is never stored.
    """
    x = np.uint32(b)
    bits = ((x & np.uint32(0x80)) << np.uint32(24)) | ((x & np.uint32(0x7F)) << np.uint32(20))
    return np.uint32(bits).view(np.float32) * _FP8_REBIAS


def to_f32(x):
    """One K or V element as float32: unchanged, widened from float16 bits, an int8
    code converted, or an fp8 e4m3 code looked up (the scale is not applied here)."""
    if isinstance(x, np.uint16):
        return half_to_f32(x)
    if isinstance(x, np.uint8):
        return FP8_E4M3[x]
    return np.float32(x)


@overload(to_f32, jit_options=JIT_OPTIONS)
def _to_f32_jit(x):
    if x == types.uint16:
        return _widen_impl()
    if x == types.uint8:
        return lambda x: fp8_bits_to_f32(x)
    if x == types.int8:
        return lambda x: np.float32(x)
    return lambda x: x
