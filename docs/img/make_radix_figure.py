"""Make docs/img/radix_tree.png: the radix tree growing, splitting and evicting.

Run from the repository root: ``python docs/img/make_radix_figure.py``.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's paged_np, not an installed one

from paged_np.viz.radix import radix_story  # noqa: E402

radix_story().savefig(ROOT / "docs/img/radix_tree.png", dpi=110, bbox_inches="tight")
