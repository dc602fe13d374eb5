"""Every Numba compilation of a run, with its seconds and the phase it fell in.

Numba compiles a ``@njit`` kernel on its first call with a new signature (or
loads it from its on-disk cache, which costs far less). A first run is slow
when many signatures compile, and misleading when some compile inside the
serving loop: the time lands in tokens/s. This log shows both::

    from paged_np.cli.compile_log import CompileLog

    with CompileLog() as log:
        log.phase = "warm-up"
        ...                                  # calls that compile
        log.phase = "serving"
        ...
    print(log.table())                       # slowest first, totals per phase

It listens to Numba's ``"numba:compile"`` event (:mod:`numba.core.event`),
which fires around each compilation that the disk cache could not serve (a
cache hit fires none). A kernel that calls another compiles its callee inside
its own event, so each entry has its inclusive seconds and its ``self_s``, the
seconds not spent in a nested compile: ``self_s`` adds up to the wall time.

:func:`log_demo` runs ``python -m paged_np demo`` under a log, its phases
marked (``python -m paged_np.cli.compile_log OUT.json [demo flags]`` in a fresh
process: ``benchmarks/compile_log.py`` and ``tests/test_first_run.py`` do).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

from numba.core import event


@dataclass
class Compile:
    """One compilation: which kernel, for which argument types, how long, when."""

    name: str            # module.function of the dispatcher
    signature: str       # the argument types, as Numba prints them
    seconds: float       # inclusive of nested compiles of the kernels it calls
    self_s: float        # without them
    phase: str           # what the run was doing (set by the caller)
    depth: int           # 0: called from Python; 1+: compiled as a callee of another


class CompileLog(event.Listener):
    """Records every ``numba:compile`` event while it is installed (a context manager)."""

    def __init__(self, phase: str = "start"):
        self.phase = phase
        self.records: list[Compile] = []
        self._stack: list[list] = []      # [start time, seconds spent in nested compiles]
        self._install = None

    def on_start(self, ev):
        self._stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        t0, nested = self._stack.pop()
        dt = time.perf_counter() - t0
        if self._stack:
            self._stack[-1][1] += dt
        d = ev.data["dispatcher"]
        f = d.py_func
        sig = ", ".join(str(a) for a in ev.data["args"])
        self.records.append(Compile(f"{f.__module__}.{f.__qualname__}", sig, dt, dt - nested,
                                    self.phase, len(self._stack)))

    def __enter__(self):
        self._install = event.install_listener("numba:compile", self)
        self._install.__enter__()
        return self

    def __exit__(self, *exc):
        return self._install.__exit__(*exc)

    def in_phase(self, phase: str) -> list[Compile]:
        """The compilations that happened while ``self.phase == phase``."""
        return [r for r in self.records if r.phase == phase]

    def totals(self) -> dict[str, tuple[int, float]]:
        """``{phase: (compilations, seconds)}``; seconds sum ``self_s`` (no double counting)."""
        out: dict[str, tuple[int, float]] = {}
        for r in self.records:
            n, s = out.get(r.phase, (0, 0.0))
            out[r.phase] = (n + 1, s + r.self_s)
        return out

    def table(self) -> str:
        """A markdown table, slowest (by ``self_s``) first, then the totals per phase."""
        rows = ["| phase | kernel | signature | self s | incl. s |",
                "|---|---|---|---:|---:|"]
        for r in sorted(self.records, key=lambda r: -r.self_s):
            callee = " (callee)" if r.depth else ""
            rows.append(f"| {r.phase} | `{r.name}`{callee} | `{r.signature}` | "
                        f"{r.self_s:.2f} | {r.seconds:.2f} |")
        rows += ["", "| phase | compilations | seconds |", "|---|---:|---:|"]
        for phase, (n, s) in self.totals().items():
            rows.append(f"| {phase} | {n} | {s:.1f} |")
        n, s = len(self.records), sum(r.self_s for r in self.records)
        rows.append(f"| **all** | **{n}** | **{s:.1f}** |")
        return "\n".join(rows)


def cache_stats(prefix: str = "paged_np") -> dict[str, tuple[int, int]]:
    """``{module.function: (disk-cache hits, misses)}`` of every loaded Numba dispatcher.

    A miss is a compilation; a hit is machine code loaded from ``__pycache__``
    (or ``NUMBA_CACHE_DIR``). Only dispatchers bound to a module-level name of a
    loaded ``prefix.*`` module are found.
    """
    from numba.core.dispatcher import Dispatcher

    out = {}
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname == prefix or modname.startswith(prefix + ".")):
            continue
        for name, obj in vars(mod).items():
            if isinstance(obj, Dispatcher) and obj.py_func.__module__ == modname:
                s = obj.stats
                out[f"{modname}.{name}"] = (sum(s.cache_hits.values()),
                                            sum(s.cache_misses.values()))
    return out


#: The demo's phases, in order (:func:`log_demo`).
PHASES = ("load", "warm-up", "serving", "verify", "draw")


def log_demo(argv: list[str]) -> dict:
    """Run ``python -m paged_np demo`` (flags ``argv``) with a :class:`CompileLog`.

    The phases are the demo's own steps, marked by wrapping the two functions
    it calls between them (:func:`paged_np.engine.replay.warm_up` and
    ``paged_np.cli.demo_model.verify``): ``load`` (imports, ``LLM(...)``),
    ``warm-up`` (the "JIT compile" line), ``serving`` (the loop behind the
    printed tokens/s), ``verify`` (the dense check), ``draw``. Returns
    ``{"status", "records": [Compile as dict], "stats": {phase: cache_stats()
    at its end}}``.
    """
    import paged_np.cli.demo_model as demo_model
    import paged_np.engine.replay as replay

    log, stats = CompileLog(phase="load"), {}

    def mark(phase):
        stats[log.phase] = cache_stats()
        log.phase = phase

    def wrap(fn, before, after):
        def wrapped(*a, **k):
            mark(before)
            out = fn(*a, **k)
            mark(after)
            return out
        return wrapped

    saved = replay.warm_up, demo_model.verify
    replay.warm_up = wrap(replay.warm_up, "warm-up", "serving")
    demo_model.verify = wrap(demo_model.verify, "verify", "draw")
    try:
        with log:
            status = demo_model.main(argv)
            mark("end")
    finally:
        replay.warm_up, demo_model.verify = saved
    return dict(status=status, stats=stats, records=[r.__dict__ for r in log.records])


if __name__ == "__main__":
    # python -m paged_np.cli.compile_log OUT.json [demo flags]: the log of one demo, as JSON
    result = log_demo(sys.argv[2:])
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
    sys.exit(result["status"])
