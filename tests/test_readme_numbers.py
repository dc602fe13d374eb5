"""The README's kernel figures are those of benchmarks/results.md (no hand-copied drift).

``python -m paged_np bench --out benchmarks`` rewrites results.md with one section
per instruction set measured (``### AVX2 (...) code on CPU``). The README quotes each
section under a heading ``### Attention kernels, <ISA> code``: a few rows of its
decode table, its prefill line and its JIT line. This test reads both files and names
any figure that differs, and any README section whose ISA results.md lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_HEADING = re.compile(r"^### Attention kernels, (\S+) code", re.M)
RESULTS_HEADING = re.compile(r"^### (\S+) \(.*$", re.M)


def _table(text: str, first_header: str) -> list[dict]:
    """Rows of the first markdown table whose header starts with ``| first_header |``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))))
    return rows


def _sections(text: str, heading: re.Pattern) -> dict[str, str]:
    """ISA name -> the text from its heading to the next heading of the same kind."""
    marks = list(heading.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.start():end] for m, end in zip(marks, ends)}


def _readme_sections() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    bench = text[text.index("## Benchmarks"):]
    bench = bench[:bench.index("\n## ", 1)] if "\n## " in bench[1:] else bench
    return _sections(bench, README_HEADING)


def _results_sections() -> dict[str, str]:
    return _sections((ROOT / "benchmarks/results.md").read_text(), RESULTS_HEADING)


def test_readme_quotes_every_isa_of_results_md():
    readme, results = _readme_sections(), _results_sections()
    assert results, "benchmarks/results.md has no '### <ISA> (...)' section"
    assert sorted(readme) == sorted(results), (
        f"README quotes kernel sections {sorted(readme)}, results.md has {sorted(results)}")


def test_readme_decode_tables_match_results_md():
    results = _results_sections()
    same = ["ms", "K/V GB/s", "limit", "% of limit", "vs torch SDPA", "vs NumPy kernel"]
    for isa, section in _readme_sections().items():
        assert isa in results, f"README section {isa} is not in benchmarks/results.md"
        theirs = {(r["pages"], r["context"]): r for r in _table(results[isa], "pages")}
        rows = _table(section, "pages")
        assert rows, f"README section {isa} has no decode table"
        for row in rows:
            key = (row["pages"], row["context"])
            assert key in theirs, f"README {isa} row {key} is not in benchmarks/results.md"
            for col in same:
                assert row[col] == theirs[key][col], (
                    f"README {isa} {key} {col}={row[col]!r} but benchmarks/results.md says "
                    f"{theirs[key][col]!r}")


def test_readme_prefill_and_jit_lines_match_results_md():
    results = _results_sections()
    for isa, section in _readme_sections().items():
        flat = " ".join(section.split())                  # the README wraps its lines
        for pattern in (r"^Causal prefill, .*$", r"^JIT: .*$"):
            line = re.search(pattern, results[isa], re.M).group(0)
            assert line in flat, f"README {isa} lacks the line of results.md: {line!r}"


def test_readme_quantized_weights_table_matches_model_quant_md():
    # The README's "### Quantized weights" table copies rows of benchmarks/model_quant.md
    # (written by `python -m paged_np bench --model smollm2-135m-instruct`).
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Quantized weights"):]
    section = section[:section.index("\n### ", 1)]
    theirs = {r["weights"]: r for r in _table((ROOT / "benchmarks/model_quant.md").read_text(),
                                              "weights")}
    rows = _table(section, "weights")
    assert rows, "README's quantized-weights section has no table"
    for row in rows:
        assert row["weights"] in theirs, f"README row {row['weights']!r} not in model_quant.md"
        for col, value in row.items():
            assert value == theirs[row["weights"]][col], (
                f"README {row['weights']} {col}={value!r} but benchmarks/model_quant.md says "
                f"{theirs[row['weights']][col]!r}")
    flat = " ".join(section.split())
    for line in re.findall(r"^(?:Quantized weight-streaming bound|Decode, ).*$",
                           (ROOT / "benchmarks/model_quant.md").read_text(), re.M):
        assert line in flat, f"README lacks the line of model_quant.md: {line!r}"
