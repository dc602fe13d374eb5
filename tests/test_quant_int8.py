"""int8 activations (paged_np.quant.int8): the integer products against an integer
reference, a row's bits independent of the batch, the VNNI instruction against its plain
IR twin, the layout's round trip, and the model on it (``quantization="gguf_a8"``)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import tiny_model
from numba import njit

import paged_np as pnp
from paged_np.models.llama import ForwardBatch, weight_shapes
from paged_np.models.quantized import quantize_weights, with_int8_activations
from paged_np.quant import QuantMatrix, simd
from paged_np.quant import int8 as I8
from paged_np.quant.blocks import quantize_q8_0

RNG = np.random.default_rng(0)


def q4_blocks(rows, nb, rng):
    """Random Q4_1 blocks: codes 0..15, scales, (negative) minimums."""
    return (rng.integers(0, 16, (rows, nb, 32)).astype(np.uint8),
            (rng.random((rows, nb)) * 0.1).astype(np.float32),
            (-rng.random((rows, nb)) * 0.8).astype(np.float32))


def blocks(fmt, rows, k, rng):
    if fmt == "Q4_1":
        return q4_blocks(rows, k // 32, rng)
    return quantize_q8_0(rng.standard_normal((rows, k)).astype(np.float32))


def integer_reference(x, q, d, m, fmt):
    """The formula of paged_np.quant.int8 in float64: int8 codes of x, exact integer sums."""
    xq, xd, xs = I8.quantize_rows(x)
    T, K = x.shape
    u = q.astype(np.int64) + (128 if fmt == "Q8_0" else 0)
    mm = -128.0 * d.astype(np.float64) if fmt == "Q8_0" else m
    isum = np.einsum("tbj,rbj->trb", xq.reshape(T, K // 32, 32).astype(np.int64), u)
    return (d[None] * xd[:, None, :].astype(np.float64) * isum
            + mm[None] * xs[:, None, :]).sum(-1)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows, k", [(576, 576), (40, 64), (200, 96)])
def test_products_equal_the_integer_reference(fmt, rows, k):
    q, d, m = blocks(fmt, rows, k, RNG)
    a = QuantMatrix.from_blocks(fmt, q, d, m, int8_activations=True)
    for T in (1, 2, 3, 4, 5, 8, 9, 17):
        x = RNG.standard_normal((T, k)).astype(np.float32)
        ref = integer_reference(x, q, d, m, fmt)
        got = x @ a
        assert got.shape == (T, rows)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_a_row_has_the_same_bits_in_any_batch(fmt):
    # The property greedy speculative decoding needs: a verify step's row equals the row
    # a one-token step computes, to the bit (four-row and one-row passes alike).
    q, d, m = blocks(fmt, 96, 128, RNG)
    a = QuantMatrix.from_blocks(fmt, q, d, m, int8_activations=True)
    x = RNG.standard_normal((11, 128)).astype(np.float32)
    whole = x @ a
    for i in range(11):
        assert np.array_equal(x[i:i + 1] @ a, whole[i:i + 1])
    assert np.array_equal(x[3:9] @ a, whole[3:9])


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_close_to_the_float_kernels(fmt):
    # The input's rounding is the only difference: within a few tenths of a percent.
    q, d, m = blocks(fmt, 256, 576, RNG)
    a = QuantMatrix.from_blocks(fmt, q, d, m, int8_activations=True)
    f = QuantMatrix.from_blocks(fmt, q, d, m)
    x = RNG.standard_normal((5, 576)).astype(np.float32)
    exact = x @ f
    err = np.abs(x @ a - exact).max() / np.abs(exact).max()
    assert 0 < err < 0.02, err


def test_quantize_rows_rounds_each_block_to_its_own_scale():
    x = RNG.standard_normal((3, 96)).astype(np.float32) * np.array([1, 100, 1e-3],
                                                                   np.float32)[:, None]
    x[1, 32:64] = 0.0                                            # an all-zero block
    xq, xd, xs = I8.quantize_rows(x)
    assert xq.dtype == np.int8 and np.abs(xq.astype(int)).max() <= 127
    blocks_x = x.reshape(3, 3, 32)
    np.testing.assert_allclose(xd, np.abs(blocks_x).max(-1) / 127, rtol=1e-6)
    assert xd[1, 1] == 0 and not xq[1, 32:64].any() and xs[1, 1] == 0
    err = np.abs(xq.reshape(3, 3, 32) * xd[..., None] - blocks_x)
    assert np.all(err <= xd[..., None] * 0.5 * (1 + 1e-5))
    np.testing.assert_allclose(xs, xd * xq.reshape(3, 3, 32).sum(-1), rtol=1e-6)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_layout_round_trip_lookup_and_fusion(fmt):
    q, d, m = blocks(fmt, 50, 64, RNG)                           # 50 rows: a padded chunk
    f = QuantMatrix.from_blocks(fmt, q, d, m)
    a = f.with_int8_activations()
    assert a.int8_activations and a.with_int8_activations() is a
    q2, d2, m2 = a.blocks()
    assert np.array_equal(q2, q.astype(q2.dtype)) and np.array_equal(d2, d)
    if fmt == "Q4_1":
        assert np.array_equal(m2, m)
    ids = np.array([0, 17, 49, 16])
    assert np.array_equal(a[ids], f[ids])                        # the embedding lookup
    np.testing.assert_array_equal(a.dequantize(), f.dequantize())
    fused = QuantMatrix.concat([a, a])
    assert fused.int8_activations and fused.shape == (64, 100)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    assert np.array_equal(x @ fused, np.concatenate([x @ a, x @ a], axis=1))
    dense = QuantMatrix.dense(np.ones((64, 8), np.float32))
    assert dense.with_int8_activations() is dense                # F32 stays float


@njit
def _dot_both(u, s):
    acc_vnni = simd.dot4(simd.zeros_i32(), simd.load_u8x64(u, 0), simd.broadcast4(s, 0))
    acc_ir = simd.dot4_generic(simd.zeros_i32(), simd.load_u8x64(u, 0), simd.broadcast4(s, 0))
    out = np.zeros(32, np.float32)
    simd.store_f32(out, 0, simd.to_f32(acc_vnni))
    simd.store_f32(out, 16, simd.to_f32(acc_ir))
    return out


def test_dot4_equals_its_plain_ir_twin_at_the_extremes():
    # Unsigned 255 times signed -128: the instruction's corner (no saturation in vpdpbusd).
    for u, s in [(np.full(64, 255, np.uint8), np.full(4, -128, np.int8)),
                 (RNG.integers(0, 256, 64).astype(np.uint8),
                  RNG.integers(-128, 128, 4).astype(np.int8))]:
        out = _dot_both(u, s)
        ref = (u.reshape(16, 4).astype(np.int64) * s.astype(np.int64)).sum(-1)
        assert np.array_equal(out[:16], ref) and np.array_equal(out[16:], ref)


@njit
def _dot_lowerings(u, s):
    """Every lowering of the dot product on ``u``, ``s``: [dot4, generic, AVX2, and the
    nibble forms (meaningful where ``u`` <= 15)] as float32 rows of 16."""
    uv, sv = simd.load_u8x64(u, 0), simd.broadcast4(s, 0)
    z = simd.zeros_i32()
    out = np.zeros((5, 16), np.float32)
    for i, acc in enumerate((simd.dot4(z, uv, sv), simd.dot4_generic(z, uv, sv),
                             simd.dot4_avx2(z, uv, sv), simd.dot4_nibbles(z, uv, sv),
                             simd.dot4_nibbles_avx2(z, uv, sv))):
        simd.store_f32(out[i], 0, simd.to_f32(acc))
    return out


def _signed(n):
    return RNG.integers(-128, 128, n).astype(np.int8)


def test_the_avx2_lowering_is_exact_where_int16_would_saturate():
    # vpmaddubsw adds two u8 x s8 products in int16, saturating: 255 x -128 twice is
    # -65280. The AVX2 dot4 splits codes into nibbles so that no pair can saturate; the
    # nibble form (Q4's codes, <= 15) needs no split. Both must equal the integers.
    cases = [(np.full(64, 255, np.uint8), np.full(4, -128, np.int8)),
             (np.full(64, 255, np.uint8), np.full(4, 127, np.int8)),
             (np.full(64, 15, np.uint8), np.full(4, -128, np.int8)),
             (RNG.integers(0, 256, 64).astype(np.uint8), _signed(4)),
             (RNG.integers(0, 16, 64).astype(np.uint8), _signed(4))]
    if not simd.HAS_AVX2:
        pytest.skip("this CPU has no AVX2: the AVX2 lowering cannot run here")
    for u, s in cases:
        out = _dot_lowerings(u, s)
        ref = (u.reshape(16, 4).astype(np.int64) * s.astype(np.int64)).sum(-1)
        assert np.array_equal(out[:3], np.broadcast_to(ref, (3, 16))), (u[:4], s)
        if u.max() <= 15:
            assert np.array_equal(out[3:], np.broadcast_to(ref, (2, 16))), (u[:4], s)


# ------------------------------------------------------------------ the model
@pytest.fixture(scope="module")
def a8_model():
    float_model = tiny_model(seed=3)
    shapes = weight_shapes(float_model.cfg)
    return pnp.LlamaModel(float_model.cfg, with_int8_activations(
        quantize_weights({k: float_model.w[k] for k in shapes})))


def forward_rows(model, cache, seq, tokens, start, keep=False):
    """Logits of every token of ``tokens`` fed at positions ``start...`` (rolled back
    unless ``keep``)."""
    slots = cache.allocate_slots(seq, len(tokens))
    meta = cache.batch([seq])
    T = len(tokens)
    batch = ForwardBatch(np.array(tokens, np.int64), np.arange(start, start + T), slots,
                         np.array([0, T], np.int32), meta.block_tables, meta.seq_lens,
                         np.arange(T, dtype=np.int64))
    logits = model.forward(batch, cache)
    if keep:
        cache.append_tokens(seq, tokens)
    else:
        cache.discard_pending(seq)
    return logits


@pytest.fixture(scope="module")
def f32_inputs_model():
    """The same tiny model's weights quantized, float32 inputs (the default kernels)."""
    float_model = tiny_model(seed=3)
    shapes = weight_shapes(float_model.cfg)
    return pnp.LlamaModel(float_model.cfg,
                          quantize_weights({k: float_model.w[k] for k in shapes}))


@pytest.mark.parametrize("inputs", ["int8", "float32"])
@pytest.mark.parametrize("page_size", [4, 16])
def test_forward_rows_do_not_depend_on_the_batch(a8_model, f32_inputs_model, inputs,
                                                 page_size):
    # Decode one token at a time vs verify nine at once, numba attention: the same bits,
    # with int8 inputs (int8.py) and with float32 inputs (kernels.py's rows and batch).
    model = a8_model if inputs == "int8" else f32_inputs_model
    engine = pnp.Engine(model, num_pages=64, page_size=page_size, backend="numba")
    cache = engine.cache
    prompt = RNG.integers(0, 128, 37).tolist()
    drafts = RNG.integers(0, 128, 9).tolist()
    cache.add_sequence("s", prompt)
    forward_rows(model, cache, "s", prompt, 0, keep=True)
    verify = forward_rows(model, cache, "s", drafts, len(prompt))
    for i in range(len(drafts)):
        one = forward_rows(model, cache, "s", drafts[:i + 1], len(prompt))[i]
        assert np.array_equal(one, verify[i]), f"row {i} differs"
    cache.free("s")


def test_greedy_speculation_unchanged_on_int8_activations(a8_model):
    prompts = [[5, 9, 2, 7, 1] * 3 + [4], [8, 8, 3, 6] * 4, [1, 2, 3] * 5 + [9, 9]]
    params = pnp.SamplingParams(max_tokens=30, temperature=0)
    spec = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3,
            "prompt_lookup_min": 1}
    outs = {}
    for s in (None, spec):
        engine = pnp.Engine(a8_model, num_pages=64, page_size=4, backend="numba",
                            speculative_config=s)
        outs[s is None] = [o.samples[0].token_ids for o in engine.generate(prompts, params)]
        assert engine.cache.stats()["num_in_use"] == 0
        if s is not None:
            assert engine.metrics["spec_num_accepted_tokens"] > 0
    assert outs[True] == outs[False]
