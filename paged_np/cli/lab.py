"""``python -m paged_np lab NAME --solution PATH``: check a lab file by running the engine on it.

``NAME`` is a lab (``slots``, ``attention``, ``prefix``, ``cow``, ``eviction``,
``scheduler``, ``sampler``, ``step``: the course's order) or ``all``, whose
``--solution`` is a folder holding every lab's file (``labs/`` by default).
Exit status 0 when the lab is accepted, 1 when it is not done yet or not
right yet, 2 for a bad command line. See :mod:`paged_np.labs` and ``docs/labs.md``.
"""

from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    from ..labs.runner import LABS, lab_module

    lines = [f"  {i}. {name:<10} {lab_module(name).TITLE}  (labs/{lab_module(name).FILE})"
             for i, name in enumerate(LABS, 1)]
    p = argparse.ArgumentParser(
        prog="python -m paged_np lab",
        description="Swap your lab's functions into the real engine, serve a toy workload "
                    "and SmolLM2 through them, and compare every token with the package's.",
        epilog="labs, in course order:\n" + "\n".join(lines)
               + "\n  all: every lab's file of --solution DIR at once",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=[*LABS, "all"], help="the lab (or all)")
    p.add_argument("--solution", default=None,
                   help="your file (default labs/NN_NAME.py), or for all a folder "
                        "(default labs/)")
    p.add_argument("--hint", type=int, choices=(1, 2, 3), default=1,
                   help="on failure: 1 the case only, 2 the idea too, 3 how to write it")
    p.add_argument("--seed", type=int, default=None,
                   help="the random cases and the toy workload (printed on every run)")
    p.add_argument("--no-smollm2", action="store_true",
                   help="serve the toy workload only (fast; SmolLM2 is downloaded once, "
                        "98 MB, and takes a minute on two cores)")
    return p


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from ..errors import ModelFetchError, PagedNPError
    from ..labs.runner import lab_module, run

    args = parser().parse_args(argv)
    path = args.solution
    if path is None:
        path = "labs" if args.name == "all" else str(Path("labs") / lab_module(args.name).FILE)
    if not Path(path).exists():
        print(f"lab {args.name}: {path} does not exist (pass --solution PATH)", file=sys.stderr)
        return 2
    try:
        result = run(args.name, path, hint=args.hint, seed=args.seed,
                     smollm2=None if args.no_smollm2 else "load")
    except ModelFetchError as e:
        print(f"lab {args.name}: SmolLM2 could not be fetched ({e}); --no-smollm2 serves "
              "the toy workload only", file=sys.stderr)
        return 2
    except PagedNPError as e:                 # a bad --solution (not a file, ...)
        print(f"lab {args.name}: {e}", file=sys.stderr)
        return 2
    print(result.message)
    return 0 if result.ok else 1
