"""8-bit KV pages: the formats, the config, and scales that travel with their page.

The formats (:mod:`paged_np.cache.kv_quant`) are checked against their
definitions (int8: nearest integer of ``x / scale``; fp8 e4m3: the OCP
``float8_e4m3fn`` format that PyTorch and vLLM use, every byte decoded from
its bit fields and every rounding to the nearest value, ties to even); the cache must keep a
page's scales with it through copy-on-write, prefix hits and swap, so a
sequence reads exactly the codes and scales it wrote.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import prompts, tiny_model

import paged_np as pnp
from paged_np.cache.kv_quant import FP8_E4M3, dequantize, fp8_e4m3_encode, quantize
from paged_np.config import storage_dtype

FORMATS = ("int8", "fp8_e4m3")


# ------------------------------------------------------------------ the formats
def e4m3fn_value(byte: int) -> float:
    """The OCP FP8 E4M3 ("fn": finite, no infinities) value of one byte, from its fields:
    1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
    (m/8 x 2^-6), and S.1111.111 is NaN, the only one."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m / 8 * 2.0**-6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def test_fp8_table_is_e4m3fn_for_every_byte():
    want = np.array([e4m3fn_value(b) for b in range(256)], np.float32)
    np.testing.assert_array_equal(FP8_E4M3, want)               # NaN at 0x7F and 0xFF too
    assert want[0x7E] == 448.0 and want[0x01] == 2.0**-9         # largest, smallest


def nearest_e4m3fn(y: np.ndarray) -> np.ndarray:
    """Bytes of ``y`` (within +-448) rounded to the nearest E4M3 value, ties to the even
    code (the even mantissa), the sign kept (a negative that rounds to zero is 0x80)."""
    mags = np.array([e4m3fn_value(b) for b in range(127)])       # 0 .. 448, ascending
    a = np.abs(y.astype(np.float64))
    hi = np.clip(np.searchsorted(mags, a), 1, 126)               # mags[hi-1] <= a <= mags[hi]
    lo = hi - 1
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(y), 0x80, 0)).astype(np.uint8)


def test_fp8_encode_rounds_to_nearest_even():
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.uniform(-448, 448, 20000), rng.normal(0, 0.01, 5000),
                        (FP8_E4M3[:126] + FP8_E4M3[1:127]) / 2,  # every tie between neighbours
                        [0.0, 448.0, -448.0, 2.0**-9, 2.0**-10, -2.0**-11]]).astype(np.float32)
    np.testing.assert_array_equal(fp8_e4m3_encode(y), nearest_e4m3fn(y))


@pytest.mark.parametrize("fmt, qmax", [("int8", 127), ("fp8_e4m3", 448)])
def test_quantize_one_scale_per_row(fmt, qmax):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 64)).astype(np.float32) * rng.uniform(0.1, 50, (5, 3, 1))
    x[2, 1] = 0                                                  # an all-zero row
    q, scale = quantize(x, fmt)
    assert q.dtype == storage_dtype(fmt) and scale.shape == (5, 3)
    amax = np.abs(x).max(-1)
    np.testing.assert_allclose(scale[amax > 0], (amax / qmax)[amax > 0], rtol=1e-6)
    back = dequantize(q, scale)
    assert (back[2, 1] == 0).all()
    if fmt == "int8":       # nearest integer: off by at most half a step
        assert (np.abs(back - x) <= scale[..., None] * 0.5001).all()
        assert (np.abs(q.astype(int)).max(-1)[amax > 0] == 127).all()
    else:                   # 3 mantissa bits: relative error <= 1/16 above the subnormals
        big = np.abs(x) / scale[..., None] >= 2.0**-6
        assert (np.abs(back - x)[big] <= np.abs(x)[big] / 16 * 1.0001).all()


def test_dequantize_refuses_float_codes():
    with pytest.raises(pnp.DTypeError, match="int8 or uint8"):
        dequantize(np.zeros((2, 4), np.float32), np.ones(2, np.float32))


# ------------------------------------------------------------------ config and capacity
@pytest.mark.parametrize("name, dtype", [("auto", np.float32), ("float32", np.float32),
                                         ("float16", np.float16), ("int8", np.int8),
                                         ("fp8_e4m3", np.uint8)])
def test_cache_config_takes_every_name(name, dtype):
    cfg = pnp.CacheConfig(num_pages=4, dtype=name)
    assert cfg.dtype == dtype
    assert cfg.kv_cache_dtype == ("float32" if name == "auto" else name)
    assert cfg.quantized == (name in FORMATS)
    assert pnp.CacheConfig(num_pages=4, dtype=cfg.dtype) == cfg  # the dtype round-trips


@pytest.mark.parametrize("bad", ["int4", "bfloat16", np.float64, np.uint16])
def test_cache_config_refuses_other_dtypes(bad):
    with pytest.raises(pnp.DTypeError, match="dtype"):
        pnp.CacheConfig(num_pages=4, dtype=bad)


def test_engine_config_refuses_an_unknown_kv_cache_dtype():
    with pytest.raises(pnp.InvalidArgument, match="kv_cache_dtype must be one of"):
        pnp.EngineConfig(kv_cache_dtype="int4")


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("fmt", FORMATS)
def test_pages_per_mib_at_least_3_5x_float32(fmt, head_dim):
    """The issue's capacity target, scales included, from the same memory budget."""
    model = pnp.ModelConfig(num_heads=4, num_kv_heads=2, head_dim=head_dim, hidden_size=256)
    pages = {d: pnp.EngineConfig(kv_cache_dtype=d, kv_cache_memory="64MiB")
             .cache_config(model).num_pages for d in ("auto", fmt)}
    per_row = head_dim + 4                                       # codes + a float32 scale
    assert pages[fmt] / pages["auto"] == pytest.approx(4 * head_dim / per_row, rel=1e-3)
    assert pages[fmt] >= 3.5 * pages["auto"]


# ------------------------------------------------------------------ scales travel with pages
def small_cache(fmt, num_pages=8):
    return pnp.PagedKVCache(pnp.CacheConfig(num_pages=num_pages, page_size=4, num_layers=2,
                                            num_kv_heads=2, head_dim=8, dtype=fmt))


def read_tokens(cache, seq_id, layer=0):
    """What attention sees for a sequence: dequantized K, V rows [n, Hkv, D]."""
    n = cache.num_computed_tokens(seq_id)
    bt = cache.block_table(seq_id)
    (kp, vp), (ks, vs) = cache.layer(layer), cache.layer_scales(layer)
    out = []
    for pages, scales in ((kp, ks), (vp, vs)):
        rows = dequantize(pages[bt], scales[bt])                 # [n_pages, Hkv, ps, D]
        out.append(rows.transpose(0, 2, 1, 3).reshape(-1, 2, 8)[:n])
    return out


def fill(cache, seq_id, tokens, rng):
    slots = cache.allocate_slots(seq_id, len(tokens))
    kv = [rng.standard_normal((len(tokens), 2, 8)).astype(np.float32) for _ in range(4)]
    for layer in range(2):
        cache.write_kv(layer, slots, kv[2 * layer], kv[2 * layer + 1])
    cache.append_tokens(seq_id, tokens)
    return kv


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_quantizes_each_token_row(fmt):
    cache, rng = small_cache(fmt), np.random.default_rng(2)
    cache.add_sequence("a", list(range(6)))
    k, v, _, _ = fill(cache, "a", list(range(6)), rng)
    got_k, got_v = read_tokens(cache, "a")
    for got, x in ((got_k, k), (got_v, v)):
        np.testing.assert_array_equal(got, dequantize(*quantize(x, fmt)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_copy_on_write_copies_the_scales(fmt):
    cache, rng = small_cache(fmt), np.random.default_rng(3)
    cache.add_sequence("a", list(range(6)))
    fill(cache, "a", list(range(6)), rng)                        # a half-full last page
    before = read_tokens(cache, "a")
    cache.fork("a", "b")
    fill(cache, "b", [9], rng)                                   # b writes: copies page 1
    assert cache.stats()["cow_copies"] == 1
    assert cache.block_table("a")[1] != cache.block_table("b")[1]
    after_b = read_tokens(cache, "b")
    for x, y in zip(before, after_b):
        np.testing.assert_array_equal(y[:6], x)                  # the copy reads the same
    for x, y in zip(before, read_tokens(cache, "a")):
        np.testing.assert_array_equal(y, x)                      # the original is untouched


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefix_hit_reuses_codes_and_scales(fmt):
    cache, rng = small_cache(fmt), np.random.default_rng(4)
    prompt = list(range(10))
    cache.add_sequence("a", prompt)
    fill(cache, "a", prompt, rng)
    first = read_tokens(cache, "a")
    cache.free("a")
    assert cache.add_sequence("b", prompt + [50]) == 8           # two full pages hit
    fill(cache, "b", prompt[8:] + [50], rng)
    for x, y in zip(first, read_tokens(cache, "b")):
        np.testing.assert_array_equal(y[:8], x[:8])


# ------------------------------------------------------------------ the engine
GREEDY = pnp.SamplingParams(max_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("fmt", FORMATS)
def test_engine_text_under_preemption_equals_roomy_cache(model, fmt):
    """Swap moves codes and scales byte for byte, recompute re-quantizes the same K/V:
    either way the text equals that of a cache with room for everything."""
    ps = prompts(10, seed=5, system=list(range(40, 60)))
    roomy = pnp.Engine(model, num_pages=200, page_size=4, kv_cache_dtype=fmt, backend="numpy")
    want = [o.token_ids for o in roomy.generate(ps, GREEDY)]
    for mode in ("recompute", "swap"):
        engine = pnp.Engine(model, num_pages=18, page_size=4, max_num_seqs=6,
                            max_num_batched_tokens=40, preemption_mode=mode,
                            kv_cache_dtype=fmt, backend="numba")
        assert [o.token_ids for o in engine.generate(ps, GREEDY)] == want
        assert engine.metrics["preemptions"] > 0
        if mode == "swap":
            assert engine.metrics["swapped_in"] > 0
        assert engine.cache.cfg.kv_cache_dtype == fmt and engine.cache.kv_scales is not None


def test_every_format_picks_the_dense_first_token(model):
    """The prompt's last position, computed over the 8-bit (or float16) pages, still picks
    the token the dense float32 model picks."""
    prompt = prompts(1, seed=6, low=40, high=41)[0]
    dense = model.dense_logits(prompt)[-1]
    for fmt in ("float16", "int8", "fp8_e4m3"):
        engine = pnp.Engine(model, num_pages=32, page_size=4, kv_cache_dtype=fmt,
                            backend="numpy")
        out = engine.generate([prompt], pnp.SamplingParams(max_tokens=1, temperature=0.0))
        assert out[0].token_ids == [int(np.argmax(dense))]
        assert engine.cache.cfg.kv_cache_dtype == fmt


# ------------------------------------------------------------------ the simulation
def test_simulation_slots_follow_the_page_bytes():
    from paged_np.sim.simulate import KV_SLOTS, kv_slots, page_bytes

    assert kv_slots("float16") == KV_SLOTS                      # the paper's budget
    assert page_bytes("int8") == 2 * 40 * 40 * 16 * (128 + 4)   # codes + a scale per row
    assert kv_slots("int8") == kv_slots("fp8_e4m3")
    assert kv_slots("int8") / KV_SLOTS == pytest.approx(256 / 132, rel=1e-3)
    assert kv_slots("auto") == pytest.approx(KV_SLOTS / 2, abs=16)    # whole pages


def test_simulation_int8_holds_more_of_a_trace():
    """Served through the real cache, the int8 budget admits more requests at once."""
    from paged_np.sim import workloads as wl
    from paged_np.sim.simulate import kv_slots, serve_paged

    trace = wl.sample_requests(wl.DATASETS["sharegpt"], 60, np.random.default_rng(0))
    f16 = serve_paged(trace, 16, num_slots=kv_slots("float16") // 8)
    i8 = serve_paged(trace, 16, num_slots=kv_slots("int8") // 8)
    assert i8["batch_size"] > 1.5 * f16["batch_size"]
    assert i8["preemptions"] < f16["preemptions"]


def test_readme_and_design_quote_the_committed_kv_table():
    """The decode ratios and capacities quoted in README.md and docs/design.md are those of
    benchmarks/kv_dtype.json (``python -m paged_np bench --kv-dtypes --out benchmarks``)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = json.loads((root / "benchmarks" / "kv_dtype.json").read_text())
    ratio = {r["dtype"]: r["vs_float32"] for r in res["decode"] if r["context"] == 8192}
    smol = {r["dtype"]: r["vs_float32"] for r in res["capacity"] if r["shape"] == "SmolLM2-135M"}
    for doc in ("README.md", "docs/design.md"):
        text = " ".join((root / doc).read_text().split())
        assert f"{smol['int8']:.2f}x float32's pages per MiB" in text, doc
        assert f"{ratio['int8']:.2f}x float32's time with int8 pages" in text, doc
        assert f"{ratio['fp8_e4m3']:.2f}x" in text, doc
