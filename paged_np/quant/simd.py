"""A small SIMD vocabulary for Numba: 16-lane vectors as values, and the integer dot product.

Numba has no vector types: it vectorises loops for us, and for float32
loops over rows that is enough (:mod:`.kernels`). The integer dot product
that makes int8 activations pay is a different shape of operation. One
instruction, AVX-512 VNNI's ``vpdpbusd``, multiplies 64 unsigned bytes by 64
signed bytes, adds each lane's four products together and into a 32-bit
accumulator::

    acc[r] += u[4r] s[4r] + u[4r+1] s[4r+1] + u[4r+2] s[4r+2] + u[4r+3] s[4r+3]

No loop over scalars turns into that, so this module gives Numba the vectors
and the instruction directly (``numba.core.extending.intrinsic``: each
function below emits a few lines of LLVM IR where it is called). A kernel
written with them keeps its accumulators in registers, as BLAS does,
instead of loading and storing them around every multiply.

Types (each one SIMD register of 512 bits; two of 256 on AVX2 machines)::

    U8x64    64 unsigned bytes: 16 lanes of 4 weights' codes
    I32x16   16 int32 lanes: integer accumulators
    F32x16   16 float32 lanes: scaled results

Functions (indices are flat element indices into a C-contiguous array,
checked by the caller: there is no bounds check in here)::

    load_u8x64(a, i)        a[i:i+64] as U8x64
    low_nibbles(v)          v & 15 per byte;  high_nibbles(v): v >> 4
    broadcast4(a, i)        the 4 int8 a[i:i+4], the same in all 16 lanes
    dot4(acc, u, s)         acc[r] += sum_k u[4r+k] * s[4r+k]   (vpdpbusd)
    dot4_nibbles(acc, u, s) the same where every byte of u is <= 15 (Q4's codes)
    zeros_i32(), zeros_f32()
    to_f32(v)               int32 lanes -> float32 lanes
    load_f32(a, i)          a[i:i+16];  store_f32(a, i, v)
    low_codes_f32(a, i)     the 16 bytes a[i:i+16] as float32: & 15 (Q4's low codes),
    byte_codes_f32(a, i)    unsigned (Q4's bytes), int8_codes_f32(a, i): signed (Q8's)
    splat(x)                one float32 in all 16 lanes
    add(a, b), sub(a, b)    a + b, a - b;  mul(a, b): a * b;  maximum(a, b): the larger
    zip_low(a, b)           a[0], b[0], a[1], b[1], ... a[7], b[7]; zip_high: from lane 8
    lane(v, i)              lane i of v, a float32
    fma(a, b, c)            a * b + c (rounded once)
    prefetch_l2(a, i)       ask for the cache line of a's flat element i (prefetcht1)

``dot4`` compiles to ``vpdpbusd`` where the CPU has AVX-512 VNNI
(:data:`HAS_VNNI`); else, on AVX2 (:data:`HAS_AVX2`), to AVX2's byte-pair
multiply-adds ``vpmaddubsw`` and ``vpmaddwd``, on nibbles so that no int16
sum saturates; else to the same arithmetic in plain vector IR (widen,
multiply, add the four). The same integers every way, in fewer or more
instructions: on an AVX2-only EPYC the plain IR made the int8 products 2.7x
(one row) to 7x (nine rows) slower than the AVX2 lowering
(``benchmarks/spec_decode_avx2.md``). ``add``, ``sub``, ``mul`` and ``fma`` are exact
IEEE operations (no fast-math flags): a kernel written with them computes the same bits
whatever the number of rows, the property speculative decoding leans on.
"""

from __future__ import annotations

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import config
from numba.core.extending import intrinsic, models, overload, register_model

LANES = 16


def _has(feature: str) -> bool:
    """True when Numba compiles for a CPU with ``feature``, by Numba's own rule: it hands
    LLVM ``NUMBA_CPU_FEATURES`` when that is set (empty for ``NUMBA_CPU_NAME=generic``),
    else the host's features. So ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` on an
    AVX-512 machine has none of them, like the AVX2 machine it imitates."""
    if config.CPU_FEATURES is not None:
        return f"+{feature}" in config.CPU_FEATURES.split(",")
    return bool(llb.get_host_cpu_features().get(feature, False))


#: Whether :func:`dot4` is one ``vpdpbusd`` (AVX-512 VNNI).
HAS_VNNI = _has("avx512vnni")
#: Else, whether it is AVX2's byte-pair multiply-add (``vpmaddubsw`` then ``vpmaddwd``).
HAS_AVX2 = _has("avx2")
#: 32 vector registers (AVX-512) rather than 16: the attention kernels pick their tiles by
#: it (``attention.numba_kernels.vector_registers``).
HAS_AVX512 = _has("avx512f")


class Vec(types.Type):
    """A SIMD vector value: ``kind`` ("u8", "i32" or "f32") times ``n`` lanes."""

    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        super().__init__(name=f"{kind}x{n}")


U8x64, I32x16, F32x16 = Vec("u8", 64), Vec("i32", 16), Vec("f32", 16)
_ELEMENT = {"u8": ir.IntType(8), "i32": ir.IntType(32), "f32": ir.FloatType()}


def _ir(t: Vec) -> ir.VectorType:
    return ir.VectorType(_ELEMENT[t.kind], t.n)


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _ir(fe_type))


V_U8, V_I32, V_F32 = _ir(U8x64), _ir(I32x16), _ir(F32x16)
_I32 = ir.IntType(32)


def address(context, builder, arrty, arr, idx, pointee):
    """Pointer to ``arr``'s flat element ``idx``, typed as ``pointee``."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [idx]), ir.PointerType(pointee))


def splat_ir(builder, value, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, vt.count), [0] * vt.count))


def _function(builder, name, ret, args):
    try:
        return builder.module.get_global(name)
    except KeyError:
        return ir.Function(builder.module, ir.FunctionType(ret, args), name=name)


# ------------------------------------------------------------------ memory
@intrinsic
def load_u8x64(typingctx, a, i):
    def codegen(context, builder, sig, args):
        return builder.load(address(context, builder, sig.args[0], *args, V_U8), align=1)
    return U8x64(a, i), codegen


@intrinsic
def _load_f32(typingctx, a, i):
    def codegen(context, builder, sig, args):
        return builder.load(address(context, builder, sig.args[0], *args, V_F32), align=4)
    return F32x16(a, i), codegen


@intrinsic
def _store_f32(typingctx, a, i, v):
    def codegen(context, builder, sig, args):
        builder.store(args[2], address(context, builder, sig.args[0], args[0], args[1], V_F32),
                      align=4)
        return context.get_dummy_value()
    return types.none(a, i, v), codegen


_V16_U8, _V16_I32 = ir.VectorType(ir.IntType(8), 16), ir.VectorType(_I32, 16)


def _codes(widen, low_nibble: bool):
    """An intrinsic: the 16 bytes ``a[i:i+16]`` widened (``zext``/``sext``) to int32, the
    low nibble only if asked, as float32 lanes (exact: small integers)."""
    @intrinsic
    def codes(typingctx, a, i):
        def codegen(context, builder, sig, args):
            v = builder.load(address(context, builder, sig.args[0], *args, _V16_U8), align=1)
            w = getattr(builder, widen)(v, _V16_I32)
            if low_nibble:
                w = builder.and_(w, ir.Constant(_V16_I32, [15] * 16))
            return builder.sitofp(w, V_F32)
        return F32x16(a, i), codegen
    return codes


#: ``a[i:i+16] & 15`` (unsigned bytes) as float32 lanes: Q4's low codes.
low_codes_f32 = _codes("zext", True)
#: The unsigned bytes ``a[i:i+16]`` as float32 lanes: Q4's whole bytes.
byte_codes_f32 = _codes("zext", False)
#: The signed bytes ``a[i:i+16]`` as float32 lanes: Q8's codes.
int8_codes_f32 = _codes("sext", False)


CACHE_LINE = 64                                                  #: bytes one prefetch covers


@intrinsic
def _prefetch_l2(typingctx, a, i):
    """``llvm.prefetch(&a.flat[i], read, locality 2, data)``, x86 ``prefetcht1``: a hint
    that never faults or waits; into L2, not L1 (``docs/concepts/kernels.md``)."""
    def codegen(context, builder, sig, args):
        ptr = builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data,
                          [args[1]])
        fn = _function(builder, "llvm.prefetch.p0", ir.VoidType(), [ptr.type, _I32, _I32, _I32])
        builder.call(fn, [ptr, _I32(0), _I32(2), _I32(1)])  # read, locality 2, data cache
        return context.get_dummy_value()
    return types.void(a, types.intp), codegen


@intrinsic
def broadcast4(typingctx, a, i):
    def codegen(context, builder, sig, args):
        word = builder.load(address(context, builder, sig.args[0], *args, _I32), align=1)
        return splat_ir(builder, word, V_I32)
    return I32x16(a, i), codegen


# ------------------------------------------------------------------ integers
@intrinsic
def zeros_i32(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(V_I32, [0] * LANES)
    return I32x16(), codegen


@intrinsic
def low_nibbles(typingctx, v):
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(V_U8, [15] * 64))
    return U8x64(v), codegen


@intrinsic
def high_nibbles(typingctx, v):
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], ir.Constant(V_U8, [4] * 64))
    return U8x64(v), codegen


def _dot4_vnni(builder, acc, u, s):
    fn = _function(builder, "llvm.x86.avx512.vpdpbusd.512", V_I32, [V_I32, V_I32, V_I32])
    return builder.call(fn, [acc, builder.bitcast(u, V_I32), s])


def _dot4_generic(builder, acc, u, s):
    wide = ir.VectorType(_I32, 64)
    prod = builder.mul(builder.zext(u, wide),
                       builder.sext(builder.bitcast(s, ir.VectorType(ir.IntType(8), 64)), wide))
    out = acc
    for k in range(4):                                          # lane r: products 4r + k
        part = builder.shuffle_vector(prod, ir.Constant(wide, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, LANES),
                                                  [4 * r + k for r in range(LANES)]))
        out = builder.add(out, part)
    return out


def _dot4_avx2(builder, acc, u, s, nibbles: bool):
    """AVX2 has no four-byte dot product, but ``vpmaddubsw`` multiplies 32 unsigned by 32
    signed bytes and adds neighbouring pairs into int16, and ``vpmaddwd`` adds pairs of
    those into int32: two instructions per 32 bytes, one lane of four each. The int16
    sum saturates (255 x -128 twice does not fit), so codes above 15 are split into
    nibbles, ``u = lo + 16 hi``, each pair then at most 2 x 15 x 128: exact, like
    ``vpdpbusd``. ``nibbles``: the caller knows every byte of ``u`` is at most 15."""
    b32, h16 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(16), 16)
    w8 = ir.VectorType(_I32, 8)
    pairs = _function(builder, "llvm.x86.avx2.pmadd.ub.sw", h16, [b32, b32])
    quads = _function(builder, "llvm.x86.avx2.pmadd.wd", w8, [h16, h16])
    undef = ir.Constant(ir.VectorType(ir.IntType(8), 64), ir.Undefined)
    halves = [ir.Constant(ir.VectorType(_I32, 32), list(range(h, h + 32))) for h in (0, 32)]
    s8 = builder.bitcast(s, ir.VectorType(ir.IntType(8), 64))
    if nibbles:
        parts = [(u, 1)]
    else:
        parts = [(builder.and_(u, ir.Constant(V_U8, [15] * 64)), 1),
                 (builder.lshr(u, ir.Constant(V_U8, [4] * 64)), 16)]
    out = acc
    for part, weight in parts:
        w = ir.Constant(h16, [weight] * 16)
        r0, r1 = (builder.call(quads, [builder.call(pairs, [
            builder.shuffle_vector(part, undef, half),
            builder.shuffle_vector(s8, undef, half)]), w]) for half in halves)
        out = builder.add(out, builder.shuffle_vector(
            r0, r1, ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES)))))
    return out


def _make_dot4(emit):
    @intrinsic
    def dot4(typingctx, acc, u, s):
        def codegen(context, builder, sig, args):
            return emit(builder, *args)
        return I32x16(acc, u, s), codegen
    return dot4


def _avx2(nibbles: bool):
    return lambda builder, acc, u, s: _dot4_avx2(builder, acc, u, s, nibbles)


#: ``acc[r] += sum_k u[4r+k] * s[4r+k]``: unsigned bytes ``u`` (U8x64) times the signed
#: bytes of ``s`` (I32x16, four int8 a lane, e.g. from :func:`broadcast4`).
dot4 = _make_dot4(_dot4_vnni if HAS_VNNI else _avx2(False) if HAS_AVX2 else _dot4_generic)
#: The same where every byte of ``u`` is at most 15 (Q4's nibbles): one ``vpmaddubsw``
#: per 32 bytes on AVX2 instead of two; ``vpdpbusd`` with VNNI.
dot4_nibbles = _make_dot4(_dot4_vnni if HAS_VNNI else _avx2(True) if HAS_AVX2
                          else _dot4_generic)
#: The same, always in plain vector IR (the tests check it against ``dot4``).
dot4_generic = _make_dot4(_dot4_generic)
#: The AVX2 lowerings whatever the CPU has (for the tests; needs AVX2 to run).
dot4_avx2 = _make_dot4(_avx2(False))
dot4_nibbles_avx2 = _make_dot4(_avx2(True))


# ------------------------------------------------------------------ floats
@intrinsic
def _zeros_f32(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(V_F32, [0.0] * LANES)
    return F32x16(), codegen


@intrinsic
def to_f32(typingctx, v):
    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], V_F32)
    return F32x16(v), codegen


@intrinsic
def _splat_f32(typingctx, x):
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        value = args[0] if sig.args[0] == types.float32 else builder.fptrunc(args[0],
                                                                             ir.FloatType())
        return splat_ir(builder, value, V_F32)
    return F32x16(x), codegen


def _elementwise(op: str):
    """An intrinsic: ``a op b`` lane by lane, ``op`` an llvmlite builder method
    (``fadd``, ``fsub``, ``fmul``): no fast-math flags, so each lane is rounded once."""
    @intrinsic
    def elementwise(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return getattr(builder, op)(*args)
        return F32x16(a, b), codegen
    return elementwise


_add, sub, mul = _elementwise("fadd"), _elementwise("fsub"), _elementwise("fmul")


def _zip(half: int):
    """An intrinsic: lanes ``8h .. 8h + 7`` of ``a`` and of ``b`` interleaved,
    ``a[8h], b[8h], a[8h + 1], b[8h + 1], ...`` (``h`` = ``half``)."""
    order = [i for k in range(8 * half, 8 * half + 8) for i in (k, k + LANES)]

    @intrinsic
    def zip_half(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return builder.shuffle_vector(args[0], args[1],
                                          ir.Constant(ir.VectorType(_I32, LANES), order))
        return F32x16(a, b), codegen
    return zip_half


#: ``a[0], b[0], a[1], b[1], ..., a[7], b[7]``;  ``zip_high``: the same from lane 8.
zip_low, zip_high = _zip(0), _zip(1)


@intrinsic
def _lane(typingctx, v, i):
    """Lane ``i`` of a float32 vector, as a float32."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], builder.trunc(args[1], _I32))
    return types.float32(v, i), codegen


@intrinsic
def _maximum(typingctx, a, b):
    """Lane by lane the larger (``b`` where ``a`` is not greater): exact, in any order."""
    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", *args), *args)
    return F32x16(a, b), codegen


@intrinsic
def fma(typingctx, a, b, c):
    def codegen(context, builder, sig, args):
        fn = _function(builder, "llvm.fma.v16f32", V_F32, [V_F32, V_F32, V_F32])
        return builder.call(fn, list(args))
    return F32x16(a, b, c), codegen


# ------------------------------------------------- the float words in plain Python
# The float32 words above have twins in NumPy (a vector is a float32 array of 16), which
# jitted code never calls: ``overload`` points it to the intrinsic. So a kernel written
# with them still runs, slowly, under ``NUMBA_DISABLE_JIT=1``, where intrinsics cannot
# be called (the attention kernels are tested that way).

#: For each argument count, the overload that hands the call to an intrinsic ``f``.
_CALLS = {0: lambda f: lambda: (lambda: f()),
          1: lambda f: lambda a: (lambda a: f(a)),
          2: lambda f: lambda a, b: (lambda a, b: f(a, b)),
          3: lambda f: lambda a, b, c: (lambda a, b, c: f(a, b, c))}


def jitted_as(intr):
    """Decorator: the function is the NumPy twin; jitted code calling it calls ``intr``."""
    def register(twin):
        overload(twin)(_CALLS[twin.__code__.co_argcount](intr))
        return twin
    return register


@jitted_as(_prefetch_l2)
def prefetch_l2(a, i):
    """Hint that ``a``'s flat element ``i`` will be read soon (a no-op in plain Python)."""


@jitted_as(_load_f32)
def load_f32(a, i):
    """``a``'s flat elements ``i:i+16``."""
    return a.reshape(-1)[i:i + LANES].astype(np.float32)


@jitted_as(_store_f32)
def store_f32(a, i, v):
    """``a``'s flat elements ``i:i+16`` = ``v``."""
    a.reshape(-1)[i:i + LANES] = v


@jitted_as(_zeros_f32)
def zeros_f32():
    return np.zeros(LANES, np.float32)


@jitted_as(_splat_f32)
def splat(x):
    """``x`` (a float) in all 16 lanes."""
    return np.full(LANES, x, np.float32)


@jitted_as(_add)
def add(a, b):
    return (a + b).astype(np.float32)


@jitted_as(_maximum)
def maximum(a, b):
    """Lane by lane the larger (``b`` where ``a`` is not greater)."""
    return np.where(a > b, a, b)


@jitted_as(_lane)
def lane(v, i):
    """Lane ``i`` of ``v``, a float32."""
    return np.float32(v[i])
