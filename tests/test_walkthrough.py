"""The narrated walkthrough runs end to end, draws, and ends in the state it narrates."""

import subprocess
import sys

from paged_np.cli import walkthrough
from paged_np.viz import page_owners


def test_walkthrough_state_and_drawing(tmp_path):
    out = tmp_path / "tour.png"
    cache = walkthrough.run(str(out), quiet=True)
    assert out.stat().st_size > 10_000
    s = cache.stats()
    assert s["num_in_use"] == 0 and s["num_sequences"] == 0
    assert s["cow_copies"] == 1 and s["evictions"] >= 1
    assert s["hits"] == 16  # B and D each reused the two system-prompt pages
    assert page_owners(cache) == {}
    cache.check_invariants()


def test_walkthrough_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "paged_np", "walkthrough", "--out",
                        str(tmp_path / "w.png")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "prefix hit" in r.stdout and (tmp_path / "w.png").exists()
