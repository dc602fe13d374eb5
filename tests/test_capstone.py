"""The capstone's checker (``notebooks/capstone/check.py``) can be failed.

A blank policy is "not done yet" (exit 2). LRU itself, MRU and a constant key
fail the pass bar (exit 1): with ties broken at random a constant key is
random eviction, not LRU in disguise. Ranking by hit count alone fails the
popularity-shift trace; capping the count (a scan-resistant LRU) beats LRU on
the scan trace and passes (exit 0). A write-up of filler fails. ``--quick``
with a fixed ``--seed``: seconds per policy.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPSTONE = ROOT / "notebooks" / "capstone"
PAGE = ("On the shift trace my policy loses: 70.1% of prompt tokens hit against LRU's "
        "72.0%, because the old prompts keep their counts. " + "More words. " * 70)
CAPPED_LFU = "return (min(entry.hit_count, 2), entry.last_access_time)"


def _checker():
    spec = importlib.util.spec_from_file_location("capstone_check", CAPSTONE / "check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _policy(tmp_path, body: str, page: str = PAGE) -> Path:
    path = tmp_path / "pol.py"
    path.write_text("import random\n\nimport paged_np as pnp\n\n\n"
                    "class P(pnp.EvictionPolicy):\n    name = 'p'\n\n"
                    f"    def priority(self, entry):\n        {body}\n")
    if page:
        (tmp_path / "WHEN_IT_LOSES.md").write_text(page)
    return path


def _run(path, capsys, seed=0):
    code = _checker().main([str(path), "--quick", "--seed", str(seed)])
    return code, capsys.readouterr().out


def test_the_shipped_template_is_blank(capsys):
    assert _checker().main([str(CAPSTONE / "my_policy.py"), "--quick"]) == 2
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("body", ["return entry.last_access_time",      # LRU itself
                                  "return -entry.last_access_time",     # MRU
                                  "return 0"],                          # a constant key
                         ids=["lru", "mru", "constant"])
def test_lru_mru_and_a_constant_key_fail_the_bar(tmp_path, capsys, body):
    code, out = _run(_policy(tmp_path, body), capsys)
    assert code == 1, out
    assert "FAIL   pass bar" in out and "PASS   randomized (hash)" in out
    assert out.strip().endswith("failed: pass bar")


def test_a_constant_key_is_random_eviction_not_lru(tmp_path, capsys):
    """The tie-break is the seed's: a constant key evicts otherwise than LRU does."""
    ck = _checker()
    const = ck.load_policy(_policy(tmp_path, "return 0"), None)
    rows = ck.simulation(const, seed=0)
    assert any(abs(y - b) > 0.01 for y, b in rows.values())


def test_hit_count_alone_loses_the_popularity_shift(tmp_path, capsys):
    code, out = _run(_policy(tmp_path, "return (entry.hit_count, entry.last_access_time)"),
                     capsys)
    assert code == 1
    assert "worst" in out and "(shift)" in out.split("FAIL   pass bar")[1].splitlines()[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_policy_that_beats_lru_on_the_scan_passes(tmp_path, capsys, seed):
    code, out = _run(_policy(tmp_path, CAPPED_LFU), capsys, seed)
    assert code == 0, out
    assert "PASS   pass bar" in out and "(scan)" in out
    assert "prefill tokens, incl. recomputation" in out
    assert "REPORT randomized (radix) hit rate" in out
    assert out.strip().endswith("checked only with --real-model")


def test_filler_and_a_missing_page_fail_the_write_up(tmp_path, capsys):
    ck = _checker()
    ck.FAILED.clear()
    ck.write_up(_policy(tmp_path, CAPPED_LFU, page=""))
    (tmp_path / "WHEN_IT_LOSES.md").write_text("lorem ipsum " * 100)
    ck.write_up(tmp_path / "pol.py")
    out = capsys.readouterr().out
    assert out.count("FAIL   write-up") == 2
    assert "a trace named" in out and "a hit rate quoted" in out


def test_an_impure_policy_fails(tmp_path, capsys):
    code, out = _run(_policy(tmp_path, "return random.random()"), capsys)
    assert code == 1 and "FAIL   pure priority" in out


def test_keys_that_do_not_sort_fail(tmp_path, capsys):
    path = _policy(tmp_path, "return {'t': entry.last_access_time}")
    ck = _checker()
    assert ck.check_pure(ck.load_policy(path, None)()) is True
    assert "FAIL   pure priority: the keys do not sort" in capsys.readouterr().out
