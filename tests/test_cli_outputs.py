"""Commands write to ./paged_np_out/ by default: never over the repository's figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

from paged_np.cli import DEFAULT_OUT, bench, demo, walkthrough

ROOT = Path(__file__).resolve().parents[1]


def _tracked(path: Path) -> bool:
    """True if git tracks ``path`` or anything under it in this checkout."""
    r = subprocess.run(["git", "ls-files", "--", str(path)], cwd=ROOT, capture_output=True,
                       text=True)
    return r.returncode == 0 and bool(r.stdout.strip())


def test_defaults_are_distinct_and_touch_nothing_committed():
    defaults = [bench.parse_args([]).out, demo.parse_args([]).out,
                walkthrough.run.__defaults__[0]]
    assert defaults == [DEFAULT_OUT["bench"], DEFAULT_OUT["demo"], DEFAULT_OUT["walkthrough"]]
    assert len(set(defaults)) == 3                     # demo and walkthrough: two files
    for out in defaults:
        assert Path(out).parts[0] == "paged_np_out", out
        assert not _tracked(ROOT / out), f"{out} would overwrite committed files"
    bench_files = [Path(DEFAULT_OUT["bench"]) / n
                   for n in ("results.json", "results.md", "roofline.png")]
    assert not any(_tracked(ROOT / f) for f in bench_files)


def test_walkthrough_writes_its_own_file_in_the_current_folder(tmp_path, monkeypatch,
                                                               capsys):
    monkeypatch.chdir(tmp_path)
    assert walkthrough.main([]) == 0
    assert (tmp_path / "paged_np_out" / "walkthrough.png").stat().st_size > 10_000
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["walkthrough.png"]
