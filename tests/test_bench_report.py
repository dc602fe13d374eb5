"""The bench's report: one results.md section per instruction set, limits named per case."""

from __future__ import annotations

import json

import pytest

from paged_np.cli import bench


def _fake_run(codegen: str, ms: float) -> dict:
    """The fields of one bench run that the report reads (numbers made up, consistent)."""
    gbs = 2 * bench.B * bench.HKV * 2048 * bench.D * 4 / 1e9 / (ms / 1e3)
    return {
        "isa": {"cpu": "Test CPU", "cpu_isa": "AVX-512", "cpu_flags": ["avx2", "avx512f"],
                "numba_cpu_name": "haswell", "numba_cpu_features": "", "codegen": codegen},
        "machine": {"threads": 2, "numba": "0", "numpy": "0", "torch": None, "quick": False},
        "bandwidth_gbs": 30.0, "bandwidth_samples_gbs": [29.0, 30.0], "fma_peak_gflops": 100.0,
        "decode": [{"dtype": "float32", "context": 2048, "ms": ms, "gbs": gbs,
                    "gflops": 2 * gbs, "intensity": 2.0, "limit": "bandwidth",
                    "limit_gbs": 30.0, "pct_limit": 100 * gbs / 30.0, "pct_bw": 0.0,
                    "paged_read_gbs": 28.0, "pct_paged_read": 100 * gbs / 28.0}],
        "prefill": {"tokens": 2048, "ms": 200.0, "gflops": 70.0, "intensity": 400.0,
                    "limit": "FMA peak", "limit_gflops": 100.0, "pct_limit": 70.0},
        "page_sweep": [], "compile": {"cold_s": 9.0, "warm_s": 0.5}}


def test_results_md_keeps_one_section_per_isa(tmp_path):
    for codegen, ms in (("AVX2 (256-bit ymm, 16 registers)", 10.0),
                        ("AVX-512VL (256-bit ymm, 32 registers)", 6.0)):
        res = _fake_run(codegen, ms)
        with open(tmp_path / f"results-{bench.isa_key(res['isa'])}.json", "w") as f:
            json.dump(res, f)
    text = bench.write_results_md(str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("results-*.json")) == [
        "results-avx2.json", "results-avx512vl.json"]
    assert text.count("### ") == 2 and text == (tmp_path / "results.md").read_text()
    assert "### AVX2 (256-bit ymm, 16 registers) code on Test CPU" in text
    assert "| float32 | hnd | 2048 | 10.00 |" in text and "| float32 | hnd | 2048 | 6.00 |" in text
    # % of limit: 2 * 8 * 8 * 2048 * 128 * 4 bytes in 6 ms = 22.4 GB/s, 75% of 30 GB/s
    assert "| 2 | bandwidth | 75% |" in text
    assert "70% of the FMA peak limit" in text


@pytest.mark.parametrize("codegen, key", [("AVX-512 (512-bit zmm)", "avx512"),
                                          ("AVX2 (256-bit ymm, 16 registers)", "avx2"),
                                          ("SSE (128-bit xmm)", "sse")])
def test_isa_key(codegen, key):
    assert bench.isa_key({"codegen": codegen}) == key
