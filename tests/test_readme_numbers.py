"""The README's benchmark figures are those of benchmarks/results.md (no hand-copied drift).

``python -m paged_np bench --out benchmarks`` rewrites results.md; the README quotes
a few of its rows. This test reads both and names any figure that differs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table(text: str, first_header: str) -> list[dict]:
    """Rows of the markdown table whose header starts with ``| first_header |``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))))
    return rows


def _readme_bench_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## Benchmarks"):text.index("- Serving simulation")]


def test_readme_decode_table_matches_results_md():
    results = {(r["pages"], r["context"]): r
               for r in _table((ROOT / "benchmarks/results.md").read_text(), "pages")}
    # README column -> results.md column (README quotes % of the read measured beside it)
    same = {"ms": "ms", "K/V GB/s": "K/V GB/s", "% of read bandwidth": "% beside",
            "vs torch SDPA": "vs torch SDPA", "vs NumPy kernel": "vs NumPy kernel"}
    readme_rows = _table(_readme_bench_section(), "pages")
    assert readme_rows
    for row in readme_rows:
        key = (row["pages"], row["context"])
        assert key in results, f"README row {key} is not in benchmarks/results.md"
        for ours, theirs in same.items():
            assert row[ours] == results[key][theirs], (
                f"README {key} {ours}={row[ours]!r} but benchmarks/results.md says "
                f"{results[key][theirs]!r}")


def test_readme_prefill_and_jit_lines_match_results_md():
    res = (ROOT / "benchmarks/results.md").read_text()
    readme = " ".join(_readme_bench_section().split())      # README wraps its lines
    gflops, vs_torch = re.search(
        r"Causal prefill, \d+ tokens: [\d.]+ ms, ([\d.]+) GFLOP/s, ([\d.]+x) torch", res).groups()
    assert f"{round(float(gflops))} GFLOP/s, {vs_torch} torch SDPA" in readme
    jit = re.search(r"^JIT: .*$", res, re.M).group(0)
    assert jit in readme, f"README lacks the JIT line of results.md: {jit!r}"
