"""How fine should an 8-bit KV scale be? Measured on SmolLM2-135M's real K/V.

Run: ``python benchmarks/kv_scale_granularity.py`` (writes
``benchmarks/kv_scale_granularity.md``; needs the SmolLM2 GGUF that
``pnp.load_model("smollm2-135m-instruct")`` keeps in ``~/.cache/paged_np``).

The model reads a fixed English text that ships with Python (the Zen of
Python, ``this``, and the docstring of ``json``). At every layer the K and V
it computes are quantized (symmetric, int8 and fp8 e4m3) with a scale per

- **token-head**: one per (token, kv head), a row of ``head_dim`` values
  (what :mod:`paged_np.cache.kv_quant` does);
- **block of 32**: one per 32 values of a row (llama.cpp's q8_0);
- **page-head**: one per (page of 16 tokens, kv head), from the whole page's
  maximum (the best a per-page scale can do: a real cache fills a page token
  by token, so it would have to fix the scale early or re-quantize).

and causal attention over them is compared with attention over the float32
K/V: the relative RMS error of the attention output, averaged over layers,
with the bytes one token-head costs (float32 scales).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import paged_np as pnp
from paged_np.attention.reference import dense_attention
from paged_np.cache.kv_quant import QMAX, dequantize, fp8_e4m3_encode, quantize

OUT = Path(__file__).with_suffix(".md")
PAGE = 16


def text() -> str:
    import codecs
    import contextlib
    import io
    import json as json_module

    with contextlib.redirect_stdout(io.StringIO()):           # importing `this` prints it
        import this
    zen = codecs.decode(this.s, "rot13")
    return zen + "\n\n" + json_module.__doc__


def quant_rows(x: np.ndarray, fmt: str) -> np.ndarray:
    """Per token-head: ``x`` [L, Hkv, D] -> dequantized."""
    return dequantize(*quantize(x, fmt))


def quant_blocks(x: np.ndarray, fmt: str, block: int = 32) -> np.ndarray:
    """Per block of ``block`` values of a row (q8_0)."""
    L, Hkv, D = x.shape
    xb = x.reshape(L, Hkv, D // block, block)
    return dequantize(*quantize(xb, fmt)).reshape(L, Hkv, D)


def quant_pages(x: np.ndarray, fmt: str) -> np.ndarray:
    """Per page of PAGE tokens and kv head, from the page's maximum."""
    L, Hkv, D = x.shape
    n = -(-L // PAGE) * PAGE
    xp = np.zeros((n, Hkv, D), np.float32)
    xp[:L] = x
    tiles = xp.reshape(n // PAGE, PAGE, Hkv, D).transpose(0, 2, 1, 3)   # [P, Hkv, PAGE, D]
    amax = np.abs(tiles).max(axis=(2, 3), keepdims=True)
    scale = np.where(amax > 0, amax / QMAX[fmt], 1).astype(np.float32)
    y = tiles / scale
    if fmt == "int8":
        back = np.clip(np.rint(y), -127, 127) * scale
    else:
        from paged_np.cache.kv_quant import FP8_E4M3

        back = FP8_E4M3[fp8_e4m3_encode(y)] * scale
    return back.transpose(0, 2, 1, 3).reshape(n, Hkv, D)[:L].astype(np.float32)


SCHEMES = {"token-head": quant_rows, "block of 32": quant_blocks, "page-head": quant_pages}


def bytes_per_token_head(scheme: str, D: int) -> float:
    return D + {"token-head": 4, "block of 32": 4 * D / 32, "page-head": 4 / PAGE}[scheme]


def main() -> int:
    model, tok = pnp.load_model("smollm2-135m-instruct")        # the cached GGUF
    ids = np.asarray(tok.encode(text()), np.int64)
    cfg = model.cfg
    x = model.embed(ids)
    rope = model.rope(np.arange(len(ids)))
    errs = {(s, f): [] for s in SCHEMES for f in QMAX}
    t0 = time.perf_counter()
    for layer in range(cfg.num_layers):
        q, k, v = model.qkv(layer, x, rope)                      # [L, H, D], [L, Hkv, D] x2
        ref, _ = dense_attention(q, k, v, dtype=np.float32)      # [L, H, D]
        for (scheme, fmt), out in errs.items():
            quant = SCHEMES[scheme]
            got, _ = dense_attention(q, quant(k, fmt), quant(v, fmt), dtype=np.float32)
            out.append(float(np.sqrt(((got - ref) ** 2).mean() / (ref**2).mean())))
        x = model.finish_layer(layer, x, ref.astype(np.float32))
    rows = [{"scheme": s, "format": f, "rel_rms_error": float(np.mean(e)),
             "worst_layer": float(np.max(e)), "bytes_per_token_head":
             bytes_per_token_head(s, cfg.head_dim)} for (s, f), e in errs.items()]
    lines = ["# 8-bit KV scale granularity on SmolLM2-135M's K/V", "",
             "Made by `python benchmarks/kv_scale_granularity.py`: "
             f"{len(ids)} tokens of Python's own text (the Zen of Python and `json`'s "
             f"docstring), {cfg.num_layers} layers, {cfg.num_kv_heads} kv heads of "
             f"{cfg.head_dim}; the error is the relative RMS error of each layer's causal "
             "attention output against float32 K/V (mean over layers, and the worst layer). "
             "float32 takes 256 bytes per token-head.", "",
             "| scale per | format | rel. RMS error (mean) | worst layer | bytes per token-head |",
             "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["format"], r["bytes_per_token_head"])):
        lines.append(f"| {r['scheme']} | {r['format']} | {r['rel_rms_error']:.2e} | "
                     f"{r['worst_layer']:.2e} | {r['bytes_per_token_head']:.2f} |")
    OUT.write_text("\n".join(lines) + "\n")
    OUT.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
