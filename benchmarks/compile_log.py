"""Every Numba compilation of ``python -m paged_np demo``, and whether it fell in serving.

    python benchmarks/compile_log.py          # writes benchmarks/compile_log.md

Runs the demo (SmolLM2-135M-Instruct, 16 chats, its default flags) in a fresh
process with an empty ``NUMBA_CACHE_DIR``, with a
:class:`paged_np.cli.compile_log.CompileLog` installed, then once more on the now
warm cache. The phases are the demo's own steps
(:func:`paged_np.cli.compile_log.log_demo` marks them):

- ``load``: imports and ``LLM(...)`` (the GGUF read, the quantized weights);
- ``warm-up``: :func:`paged_np.engine.replay.warm_up`, whose time the demo
  prints as "JIT compile + first calls" and keeps out of tokens/s;
- ``serving``: the loop whose tokens/s the demo prints: anything compiled
  here is compile time counted as serving time;
- ``verify``: the dense check (it runs after the clock stops); ``draw``: the plot.

The table lists each compilation (kernel, argument types, seconds without
and with the kernels it compiled as callees), slowest first, then the totals
per phase. The warm run's line counts disk-cache loads and compilations
per phase, from each dispatcher's ``.stats``. The model must be fetched
already (``python -m paged_np demo`` once does it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_demo(cache_dir: str, out_json: Path, argv: list[str]) -> tuple[dict, str, float]:
    """One demo in a fresh process on ``cache_dir``: (its log, its stdout, wall seconds)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "paged_np.cli.compile_log", str(out_json), *argv],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out_json.exists():
        sys.exit(f"the demo failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(out_json.read_text()), proc.stdout, wall


def per_phase(run: dict) -> dict[str, tuple[int, int]]:
    """``{phase: (disk-cache loads, compilations)}`` from the dispatchers' stats."""
    from paged_np.cli.compile_log import PHASES

    out, before = {}, {}
    for phase in PHASES:
        now = run["stats"].get(phase, before)
        hits = sum(h for h, _ in now.values()) - sum(h for h, _ in before.values())
        miss = sum(m for _, m in now.values()) - sum(m for _, m in before.values())
        out[phase], before = (hits, miss), now
    return out


def printed(stdout: str, prefix: str) -> str:
    return next((line for line in stdout.splitlines() if line.startswith(prefix)), "?")


def main() -> None:
    from paged_np.cli.compile_log import PHASES, Compile, CompileLog
    from paged_np.hardware import machine_line

    argv = ["--out", str(Path(tempfile.gettempdir()) / "compile_log_demo.png")]
    with tempfile.TemporaryDirectory(prefix="numba_cache_") as cache, \
            tempfile.TemporaryDirectory() as tmp:
        cold, cold_out, cold_wall = run_demo(cache, Path(tmp) / "cold.json", argv)
        warm, warm_out, warm_wall = run_demo(cache, Path(tmp) / "warm.json", argv)
    log = CompileLog()
    log.records = [Compile(**r) for r in cold["records"]]
    load = os.getloadavg()
    lines = [
        "# Numba compilations of `python -m paged_np demo`", "",
        f"Written by `python benchmarks/compile_log.py`. Machine: {machine_line()}; load "
        f"average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min) at the end.",
        "", "## First run (empty Numba cache)", "",
        f"Wall {cold_wall:.1f} s. The demo printed: `{printed(cold_out, 'JIT compile')}` and "
        f"`{printed(cold_out, 'prefix hits')}`.", "",
        "Each compilation the disk cache could not serve, slowest first. *self s*: "
        "without the kernels it compiled as callees (these add up to the wall time); "
        "*incl. s*: with them. *(callee)*: compiled because another kernel calls it.", "",
        log.table(), "", "## Second run (the cache the first one wrote)", "",
        f"Wall {warm_wall:.1f} s. The demo printed: `{printed(warm_out, 'JIT compile')}` and "
        f"`{printed(warm_out, 'prefix hits')}`.", "",
        "| phase | disk-cache loads (first run) | compilations (first run) | "
        "loads (second run) | compilations (second run) |", "|---|---:|---:|---:|---:|"]
    pc, pw = per_phase(cold), per_phase(warm)
    for phase in PHASES:
        lines.append(f"| {phase} | {pc[phase][0]} | {pc[phase][1]} | {pw[phase][0]} | "
                     f"{pw[phase][1]} |")
    text = "\n".join(lines) + "\n"
    Path(__file__).with_name("compile_log.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
