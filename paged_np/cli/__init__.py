"""The command line, ``python -m paged_np COMMAND``: one module per subcommand.

Nothing outside this folder imports from it; each module's ``main(argv)`` is
looked up by :mod:`paged_np.__main__` only when its command is asked for.
"""

import os

#: Where a command writes when not given ``--out``: a folder of its own in the
#: current directory, so a run from the repository root never overwrites the
#: committed figures (``benchmarks/``, ``docs/img/``). One name per command.
DEFAULT_OUT_DIR = "paged_np_out"
DEFAULT_OUT = {
    "demo": os.path.join(DEFAULT_OUT_DIR, "demo.png"),
    "walkthrough": os.path.join(DEFAULT_OUT_DIR, "walkthrough.png"),
    "bench": os.path.join(DEFAULT_OUT_DIR, "bench"),          # a folder: results.*, roofline
}


def make_parent(path: str) -> str:
    """Create the folder ``path`` will be written in; return ``path``."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    return path
