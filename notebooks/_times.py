"""How long each notebook takes a newcomer: an estimate, from the sources.

    python notebooks/_times.py            # print the table; --write puts it in the docs
    python notebooks/_times.py --write    # notebooks/README.md, docs/notebooks/course.md
    python notebooks/_times.py --measure  # execute every notebook, record its run time
    python notebooks/_times.py --record LOG...  # or read them from a test run's output:
        # python -m pytest tests/test_notebooks.py -k runs_blank -s > LOG

Nobody new to the course has been timed, so the time a lesson takes is estimated
from what it asks of a reader, counted in its source (``notebooks/_src/NN_*.py``):

- **prose**: the words of its markdown cells, read at 150 words a minute (the
  reading speed usually quoted for technical text);
- **code**: the non-blank lines of its code cells, each read, run and its output
  looked at, 10 to 15 seconds a line for a newcomer (shapes to follow, an assert
  to believe);
- **exercises**: 5 to 10 minutes for one that asks for values (``check``), 20 to
  40 for one that asks for a function (``check_function``, ``check_property``);
- **running**: the seconds the notebook took to execute, blank and then solved,
  as ``tests/test_notebooks.py`` runs it (``--measure`` runs them, ``--record``
  reads the lines that test prints with ``-s``; both keep them in
  ``notebooks/_run_times.json``, with the machine and the date).

The low end is a reader who knows NumPy and gets each exercise right in a try or
two; the high end one who rereads and debugs. Both are estimates: the constants
above are ours, not measured on learners. A time from a real newcomer is welcome
in an issue; it would replace them.
"""

from __future__ import annotations

import ast
import json
import platform
import re
import sys
import textwrap
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUN_TIMES = HERE / "_run_times.json"
WORDS_PER_MINUTE = 150
SECONDS_PER_CODE_LINE = (10, 15)           # low, high
MINUTES_PER_VALUE_EXERCISE = (5, 10)
MINUTES_PER_FUNCTION_EXERCISE = (20, 40)
#: Where the table goes: files holding the markers below.
TARGETS = (HERE / "README.md", ROOT / "docs" / "notebooks" / "course.md")
BEGIN, END = "<!-- times: begin (python notebooks/_times.py --write) -->", "<!-- times: end -->"


def sources() -> list[Path]:
    return sorted((HERE / "_src").glob("[0-9][0-9]_*.py"))


def _cells(src: Path) -> list[tuple[str, str, str]]:
    """``(kind, role, text)`` per cell: kind "markdown" or "code", role the header's
    exercise/check word (or ""), text the cell's lines (markdown without its "# ")."""
    cells, kind, role, lines = [], None, "", []
    for line in src.read_text().splitlines() + ["# %% end"]:
        if line.startswith("# %%"):
            if kind is not None:
                cells.append((kind, role, "\n".join(lines)))
            kind = "markdown" if "[markdown]" in line else "code"
            words = line.split()[2:]
            role = words[0] if len(words) == 2 and words[0] in ("exercise", "check") else ""
            lines = []
        elif kind == "markdown":
            lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
        elif kind is not None:
            lines.append(line)
    return cells


def _is_function_check(text: str) -> bool:
    """A check that runs the learner's code on cases rather than comparing values."""
    try:
        calls = [n.func for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
    except SyntaxError:
        return False
    return any(isinstance(f, ast.Name) and f.id in ("check_function", "check_property")
               for f in calls)


def counts(src: Path) -> dict:
    """What the estimate reads off a source: prose words, code lines, exercises by kind."""
    words = code = values = functions = 0
    for kind, role, text in _cells(src):
        if kind == "markdown":
            prose = re.sub(r"<[^>]+>", " ", text)          # <details> tags are not words
            words += len(re.findall(r"[A-Za-z0-9][\w'.,:;()/+-]*", prose))
        else:
            code += sum(1 for ln in text.splitlines() if ln.strip())
            if role == "check":
                if _is_function_check(text):
                    functions += 1
                else:
                    values += 1
    return {"words": words, "code_lines": code, "value_exercises": values,
            "function_exercises": functions}


def estimate(c: dict, run_seconds: float) -> tuple[int, int]:
    """(low, high) minutes for a notebook with counts ``c`` that runs in ``run_seconds``."""
    out = []
    for i in (0, 1):
        minutes = (c["words"] / WORDS_PER_MINUTE
                   + c["code_lines"] * SECONDS_PER_CODE_LINE[i] / 60
                   + c["value_exercises"] * MINUTES_PER_VALUE_EXERCISE[i]
                   + c["function_exercises"] * MINUTES_PER_FUNCTION_EXERCISE[i]
                   + run_seconds / 60)
        out.append(int(5 * round(minutes / 5)))           # to 5 minutes: it is an estimate
    return out[0], out[1]


def run_times() -> dict:
    return json.loads(RUN_TIMES.read_text()) if RUN_TIMES.exists() else {"seconds": {}}


def rows() -> list[dict]:
    recorded = run_times()["seconds"]
    out = []
    for src in sources():
        c = counts(src)
        secs = recorded.get(src.stem)
        low, high = estimate(c, secs or 0.0)
        out.append({"notebook": src.stem, **c, "run_seconds": secs, "low": low, "high": high})
    return out


def _hours(minutes: int) -> str:
    return f"{minutes / 60:.1f}".rstrip("0").rstrip(".")


def table() -> str:
    """The Markdown table the docs show, with its total and where it comes from."""
    rs = rows()
    meta = run_times()
    lines = ["| notebook | prose words | code lines | exercises (values + functions) "
             "| runs in | estimate |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rs:
        runs = "not measured" if r["run_seconds"] is None else f"{r['run_seconds']:.0f} s"
        lines.append(f"| `{r['notebook']}` | {r['words']:,} | {r['code_lines']} | "
                     f"{r['value_exercises']} + {r['function_exercises']} | {runs} | "
                     f"{r['low']}-{r['high']} min |")
    low, high = sum(r["low"] for r in rs), sum(r["high"] for r in rs)
    lines.append(f"| **all {len(rs)}** | {sum(r['words'] for r in rs):,} | "
                 f"{sum(r['code_lines'] for r in rs)} | "
                 f"{sum(r['value_exercises'] for r in rs)} + "
                 f"{sum(r['function_exercises'] for r in rs)} | | "
                 f"**{_hours(low)}-{_hours(high)} h** |")
    where = meta.get("machine", "a machine not recorded")
    note = (f"*Estimates*, generated by `python notebooks/_times.py` from the notebook "
            f"sources: prose at {WORDS_PER_MINUTE} words a minute, "
            f"{SECONDS_PER_CODE_LINE[0]}-{SECONDS_PER_CODE_LINE[1]} s a code line, "
            f"{MINUTES_PER_VALUE_EXERCISE[0]}-{MINUTES_PER_VALUE_EXERCISE[1]} min an "
            f"exercise that asks for values and "
            f"{MINUTES_PER_FUNCTION_EXERCISE[0]}-{MINUTES_PER_FUNCTION_EXERCISE[1]} min one "
            f"that asks for a function, plus the measured run time ({where}). Nobody new "
            "to the course has been timed; the capstone (a day or two) is not counted.")
    return "\n".join(lines + [""] + textwrap.wrap(note, 90))


def write(text: str | None = None) -> list[Path]:
    """Put the table between the markers of every target file; returns those changed."""
    text = table() if text is None else text
    changed = []
    for path in TARGETS:
        old = path.read_text()
        a, b = old.index(BEGIN) + len(BEGIN), old.index(END)
        new = old[:a] + "\n" + text + "\n" + old[b:]
        if new != old:
            path.write_text(new)
            changed.append(path)
    return changed


def measure(only=None) -> dict:
    """Execute each notebook as the test suite does (blank, then solved); record seconds."""
    sys.path.insert(0, str(ROOT / "tests"))
    import os

    import nbclient
    from test_notebooks import _blank_then_solved

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ.pop("MPLBACKEND", None)
    rec = run_times()
    for src in sources():
        if only and not any(o in src.stem for o in only):
            continue
        nb = _blank_then_solved(HERE / f"{src.stem}.ipynb")
        t0 = time.perf_counter()
        nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(HERE)}}).execute()
        rec["seconds"][src.stem] = round(time.perf_counter() - t0, 1)
        print(f"{src.stem}: {rec['seconds'][src.stem]} s", flush=True)
    rec["machine"] = _machine()
    RUN_TIMES.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


def _machine() -> str:
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {cores} cores, load average {load:.0f} when recorded, "
            f"{date.today().isoformat()}")


def record(logs) -> dict:
    """Run times from the output of ``pytest tests/test_notebooks.py -k runs_blank -s``
    (its lines ``NN_name.ipynb: 12.3 s``); the later of two lines for one notebook wins."""
    rec = run_times()
    for log in logs:
        for stem, secs in re.findall(r"^(\d\d_\w+)\.ipynb: ([\d.]+) s$", Path(log).read_text(),
                                     re.MULTILINE):
            rec["seconds"][stem] = float(secs)
    rec["machine"] = _machine()
    RUN_TIMES.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--measure"]:
        measure(argv[1:])
        argv = ["--write"]
    elif argv[:1] == ["--record"] and len(argv) > 1:
        record(argv[1:])
        argv = ["--write"]
    if argv == ["--write"]:
        for path in write():
            print("wrote", path.relative_to(ROOT))
        return 0
    if argv:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
