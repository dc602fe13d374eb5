"""The quoted kernel and quantized-weight figures are those of the benchmark files.

The README's headline figures link to ``docs/benchmarks/summary.md``, which quotes
the benchmark files by hand (the tables the README held until issue 43).
``python -m paged_np bench --out benchmarks`` rewrites results.md with one section
per instruction set measured (``### AVX2 (...) code on CPU``). The summary quotes each
section under a heading ``## Attention kernels, <ISA> code``: a few rows of its
decode table, its prefill line and its JIT line. This test reads both files and names
any figure that differs, and any quoted section whose ISA results.md lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = "docs/benchmarks/summary.md"
QUOTED_HEADING = re.compile(r"^## Attention kernels, (\S+) code", re.M)
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


def _quoted_sections() -> dict[str, str]:
    """ISA name -> the summary's section quoting it, up to the next ``## `` heading."""
    text = (ROOT / SUMMARY).read_text()
    marks = list(QUOTED_HEADING.finditer(text))
    if not marks:
        return {}
    # Each kernel section ends at the next "## " heading of any kind.
    ends = [text.find("\n## ", m.end()) for m in marks]
    return {m.group(1): text[m.start():(end if end != -1 else len(text))]
            for m, end in zip(marks, ends)}


def _results_sections() -> dict[str, str]:
    return _sections((ROOT / "benchmarks/results.md").read_text(), RESULTS_HEADING)


def test_summary_quotes_every_isa_of_results_md():
    quoted, results = _quoted_sections(), _results_sections()
    assert results, "benchmarks/results.md has no '### <ISA> (...)' section"
    assert sorted(quoted) == sorted(results), (
        f"{SUMMARY} quotes kernel sections {sorted(quoted)}, results.md has {sorted(results)}")


def test_summary_decode_tables_match_results_md():
    results = _results_sections()
    same = ["ms", "K/V GB/s", "limit", "% of limit", "vs torch SDPA", "vs NumPy kernel"]
    for isa, section in _quoted_sections().items():
        assert isa in results, f"{SUMMARY} section {isa} is not in benchmarks/results.md"
        theirs = {(r["pages"], r.get("K layout"), r["context"]): r
                  for r in _table(results[isa], "pages")}
        rows = _table(section, "pages")
        assert rows, f"{SUMMARY} section {isa} has no decode table"
        for row in rows:
            key = (row["pages"], row.get("K layout"), row["context"])
            assert key in theirs, f"{SUMMARY} {isa} row {key} is not in benchmarks/results.md"
            for col in same:
                assert row[col] == theirs[key][col], (
                    f"{SUMMARY} {isa} {key} {col}={row[col]!r} but benchmarks/results.md says "
                    f"{theirs[key][col]!r}")


def test_summary_prefill_and_jit_lines_match_results_md():
    results = _results_sections()
    for isa, section in _quoted_sections().items():
        flat = " ".join(section.split())                  # the page wraps its lines
        for pattern in (r"^Causal prefill, .*$", r"^JIT: .*$"):
            line = re.search(pattern, results[isa], re.M).group(0)
            assert line in flat, f"{SUMMARY} {isa} lacks the line of results.md: {line!r}"


def test_summary_quantized_weights_table_matches_model_quant_md():
    # The summary's "## Quantized weights" table copies rows of benchmarks/model_quant.md
    # (written by `python -m paged_np bench --model smollm2-135m-instruct`).
    text = (ROOT / SUMMARY).read_text()
    section = text[text.index("## Quantized weights"):]
    section = section[:section.index("\n## ", 1)]
    theirs = {r["weights"]: r for r in _table((ROOT / "benchmarks/model_quant.md").read_text(),
                                              "weights")}
    rows = _table(section, "weights")
    assert rows, f"{SUMMARY}'s quantized-weights section has no table"
    for row in rows:
        assert row["weights"] in theirs, f"{SUMMARY} row {row['weights']!r} not in model_quant.md"
        for col, value in row.items():
            assert value == theirs[row["weights"]][col], (
                f"{SUMMARY} {row['weights']} {col}={value!r} but benchmarks/model_quant.md says "
                f"{theirs[row['weights']][col]!r}")
    flat = " ".join(section.split())
    for line in re.findall(r"^(?:Quantized weight-streaming bound|Decode, ).*$",
                           (ROOT / "benchmarks/model_quant.md").read_text(), re.M):
        assert line in flat, f"{SUMMARY} lacks the line of model_quant.md: {line!r}"


def test_readme_headline_figures_are_those_of_the_summary():
    # The README's "## Headline figures" quotes the summary page (which the tests above
    # hold to the benchmark files): every ratio, percentage and decimal it gives must
    # be on that page, so neither can move without the other.
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Headline figures"):]
    section = section[:section.index("\n## ", 1)]
    summary = " ".join((ROOT / SUMMARY).read_text().split())
    figures = re.findall(r"\d+(?:\.\d+)?(?:x|%)|\d+\.\d+", section)
    assert len(figures) > 20, f"README's headline figures: too few found ({figures})"
    missing = [f for f in figures if f not in summary]
    assert not missing, f"README headline figures not on {SUMMARY}: {missing}"
